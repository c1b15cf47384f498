"""`pulumi up` of the lab stack against a running lab, with the real engine, offline.

The stack is the repository's own (`Pulumi.yaml`, `__main__.py`, `components/`); only the stack
config is per lab: a copy of `Pulumi.lab.yaml` whose kubeconfig points at this lab, passed with
`--config-file`, and a file backend inside the lab's run directory, so labs never share state.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from autoheal.errors import LabError
from autoheal.paths import data_root
from lab.config import LabConfig

REPO = data_root()
STACK = "lab"


def available() -> bool:
    try:
        from lab.pulumi_env import pulumi_bin, pulumi_env  # noqa: F401

        pulumi_bin()
    except Exception:
        return False
    return (REPO / "Pulumi.yaml").exists() and (REPO / "Pulumi.lab.yaml").exists()


def _config_file(cfg: LabConfig) -> Path:
    data = yaml.safe_load((REPO / "Pulumi.lab.yaml").read_text())
    conf = data["config"]
    conf["autoheal:cluster"] = {"backend": "kubeconfig", "kubeconfig": str(cfg.kubeconfig)}
    pools = conf.get("autoheal:pools") or []
    for want, pool in zip(cfg.pools, pools, strict=False):
        pool.update(
            {
                "name": want.name,
                "prefix": want.prefix,
                "size": want.size,
                "spares": want.spares,
                "headroom": want.headroom,
                "gpusPerNode": want.gpus_per_node,
            }
        )
    path = cfg.run_dir / "pulumi" / f"Pulumi.{STACK}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _run(cfg: LabConfig, *args: str, timeout: float = 600) -> str:
    from lab.pulumi_env import pulumi_bin, pulumi_env

    env = pulumi_env(cfg.run_dir / "pulumi")
    argv = [str(pulumi_bin()), *args, "--stack", STACK, "--non-interactive"]
    res = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if res.returncode != 0:
        log = cfg.run_dir / "logs" / "pulumi.log"
        log.write_text(res.stdout + res.stderr)
        raise LabError(f"pulumi {args[0]}: exit {res.returncode}; see {log}: {res.stderr.strip()[-300:]}")
    return res.stdout


def _ensure_stack(cfg: LabConfig) -> Path:
    from lab.pulumi_env import pulumi_bin, pulumi_env

    conf = _config_file(cfg)
    env = pulumi_env(cfg.run_dir / "pulumi")
    subprocess.run(
        [str(pulumi_bin()), "stack", "init", STACK, "--non-interactive"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return conf


def up(cfg: LabConfig) -> str:
    """Create or update the lab stack; returns a one-line summary of what changed."""
    conf = _ensure_stack(cfg)
    out = _run(cfg, "up", "--yes", "--skip-preview", "--config-file", str(conf))
    return _summary(out)


def preview_changes(cfg: LabConfig) -> dict[str, int]:
    """Operation counts of a `pulumi preview` ({"same": N} means no change)."""
    conf = _ensure_stack(cfg)
    out = _run(cfg, "preview", "--config-file", str(conf), "--json")
    data = json.loads(out)
    counts: dict[str, int] = data.get("changeSummary", {})
    return counts


def destroy(cfg: LabConfig) -> None:
    conf = _ensure_stack(cfg)
    _run(cfg, "destroy", "--yes", "--skip-preview", "--config-file", str(conf))


def _summary(out: str) -> str:
    """'37 created' / '2 updated, 35 unchanged' from the Resources section of `pulumi up`."""
    resources = out.split("Resources:", 1)[-1]
    found = re.findall(
        r"^\s*[-+~]?\s*(\d+ (?:created|updated|unchanged|deleted|replaced))\s*$", resources, re.M
    )
    return ", ".join(found) or "done"
