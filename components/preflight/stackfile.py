"""A stack's config read from its files (Pulumi.yaml, Pulumi.<stack>.yaml) as the engine hands
it to the program, so the CLI checks the StackSpec that `pulumi up` would build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from autoheal.errors import ConfigError
from components.config import PROJECT, StackSpec, read_stack_config


# review/mockstack.py keeps its own copy: it runs as a script that imports nothing of the project.
def _config_text(value: Any) -> str:
    """A config value as Pulumi hands it to the program: objects and lists as JSON text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value)


def stack_values(project_dir: Path, stack: str) -> dict[str, str]:
    """The stack's config as the engine passes it: Pulumi.yaml's defaults overridden by
    Pulumi.<stack>.yaml, keys without the project prefix (as review/mockstack.py reads them)."""
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    try:
        project_doc = yaml.safe_load((project_dir / "Pulumi.yaml").read_text()) or {}
        stack_doc = yaml.safe_load(stack_file.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"stack {stack}: cannot read {exc.filename}: {exc.strerror}") from None
    name = str(project_doc.get("name", PROJECT))
    values: dict[str, Any] = {
        k: spec["default"]
        for k, spec in (project_doc.get("config") or {}).items()
        if isinstance(spec, dict) and "default" in spec
    }
    for key, value in (stack_doc.get("config") or {}).items():
        ns, _, bare = str(key).rpartition(":")
        if ns in ("", name):
            if isinstance(value, dict) and set(value) == {"secure"}:
                continue  # an encrypted value: not one the checks read
            values[bare] = value
    return {k: _config_text(v) for k, v in values.items()}


def load_stack(project_dir: Path, stack: str) -> StackSpec:
    """The validated StackSpec, read the way `__main__.py` reads `pulumi.Config`."""
    return read_stack_config(stack_values(project_dir, stack).get)
