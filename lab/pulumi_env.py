"""Run the Pulumi CLI offline against local state, with the plugins scripts/build-tools.sh built.

Why: the lab has no network beyond package registries, so Pulumi must never reach the Pulumi
Cloud, check for updates or download plugins. State lives in a local directory (file://
backend); the Python language host and the Kubernetes provider are found on PATH as "ambient"
plugins from the tool cache, whatever version the Python packages ask for; the language host
runs programs with this interpreter (the project's virtualenv) unless told otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from lab.controlplane import tool_bin_dir, tool_path


def pulumi_bin() -> Path:
    """The cached ``pulumi`` CLI (ToolMissingError, naming scripts/build-tools.sh, if absent)."""
    return tool_path("pulumi")


def pulumi_env(
    state_dir: Path,
    *,
    python: str | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for an offline ``pulumi`` run keeping all state under ``state_dir``.

    ``state_dir/state`` is the file backend, ``state_dir/home`` is PULUMI_HOME (plugin cache,
    workspace settings), so nothing is written to the user's ~/.pulumi.
    """
    for name in ("pulumi", "pulumi-language-python", "pulumi-resource-kubernetes"):
        tool_path(name)  # fail early, naming the build script
    state_dir = Path(state_dir).resolve()
    (state_dir / "state").mkdir(parents=True, exist_ok=True)
    (state_dir / "home").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if base is None else base)
    for leaked in ("PULUMI_ACCESS_TOKEN", "PULUMI_API", "PULUMI_IGNORE_AMBIENT_PLUGINS"):
        env.pop(leaked, None)
    path = env.get("PATH", "")
    env.update(
        {
            "PATH": f"{tool_bin_dir()}{os.pathsep}{path}" if path else str(tool_bin_dir()),
            "PULUMI_BACKEND_URL": f"file://{state_dir / 'state'}",
            "PULUMI_HOME": str(state_dir / "home"),
            "PULUMI_CONFIG_PASSPHRASE": "",
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true",
            "PULUMI_PYTHON_CMD": python or sys.executable,
        }
    )
    return env
