"""Run a Pulumi program under mocks and keep what it registered, with parents and inputs.

Every component test builds resources through `run_program` (review.mockstack: the SDK's public
mocks API), then asserts on the recorded inputs (the Kubernetes objects exactly as the provider
would receive them, camelCase keys).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from review.mockstack import FAKE_HOST_KEY, FAKE_SECRET, Recorded, Res, run_program

__all__ = [
    "FAKE_HOST_KEY",
    "FAKE_SECRET",
    "ROOT",
    "Recorded",
    "Res",
    "env_of",
    "lab_stack_raw",
    "pod_spec",
    "run_program",
]

ROOT = Path(__file__).resolve().parents[2]


def lab_stack_raw() -> dict[str, Any]:
    """Pulumi.lab.yaml's config, keys without the project prefix."""
    doc: dict[str, Any] = yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())
    return {k.split(":", 1)[1]: v for k, v in doc["config"].items() if k.startswith("autoheal:")}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def pod_spec(res: Res) -> dict[str, Any]:
    spec: dict[str, Any] = res.inputs["spec"]["template"]["spec"]
    return spec
