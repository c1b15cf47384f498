"""The policy pack (policy/) under the real Pulumi engine: `pulumi preview --policy-pack policy`.

The engine starts the pack through the language host's RunPlugin (the offline-built host in
tools/gobuild/pulumi), so this is the check that the host can run it at all. The stack is the lab
stack (Pulumi.lab.yaml) pointed at a control plane this module starts in a temporary folder (and
always stops); the project is a copy outside the work tree with the project's virtualenv, the state
a temporary file backend. The lab stack passes; a pool without spares (and no waiver) fails the
preview with the pack's violation. Needs the Go-built tools (scripts/build-tools.sh); a missing
tool fails, never skips.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import controlplane
from lab.pulumi_env import pulumi_bin, pulumi_env
from tests.components.harness import ROOT
from tests.support import port_base

pytestmark = [pytest.mark.kube, pytest.mark.pulumi]

PORT_BASE = port_base(25840)
STACK = "lab"
POLICY = ROOT / "policy"
POOL_RULE = "gpu-pool-spares-and-remediation"

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    run_dir = tmp_path_factory.mktemp("kube-policy")
    try:
        # No nodes: the lab stack does not wait for rollouts, and a preview creates nothing.
        yield controlplane.start_control_plane(run_dir, [], PORT_BASE, timeout=120).kubeconfig
    finally:
        controlplane.stop_control_plane(run_dir)


def _lab_config(kubeconfig: Path) -> dict[str, Any]:
    cfg: dict[str, Any] = copy.deepcopy(yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())["config"])
    cfg["autoheal:cluster"]["kubeconfig"] = str(kubeconfig)
    cfg["autoheal:runner"] = {
        **cfg.get("autoheal:runner", {}),
        "rulesFile": str(ROOT / "config" / "rules.yaml"),
        "playbooksDir": str(ROOT / "playbooks"),
    }
    return cfg


@pytest.fixture(scope="module")
def preview(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Any]], Any]:
    """preview(config) -> the finished `pulumi preview --policy-pack policy` of the lab stack."""
    proj = tmp_path_factory.mktemp("policy-project")
    for name in ("Pulumi.yaml", "__main__.py"):
        (proj / name).write_text((ROOT / name).read_text())
    (proj / ".venv").symlink_to(ROOT / ".venv")
    env = pulumi_env(tmp_path_factory.mktemp("policy-state"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(pulumi_bin()), *args, "--non-interactive", "--color", "never"],
            cwd=proj,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    init = run("stack", "init", STACK)
    assert init.returncode == 0, f"pulumi stack init failed:\n{init.stdout}\n{init.stderr}"

    def do(config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        cfg_file = proj / f"config-{len(list(proj.glob('config-*.yaml')))}.yaml"
        cfg_file.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
        return run("preview", "--stack", STACK, "--config-file", str(cfg_file), "--policy-pack", str(POLICY))

    return do


def _output(res: subprocess.CompletedProcess[str]) -> str:
    return f"exit {res.returncode}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"


def _assert_pack_ran(res: subprocess.CompletedProcess[str]) -> None:
    out = res.stdout + res.stderr
    assert "RunPlugin not implemented" not in out, _output(res)
    # The summary's "Policies:" section names the pack once the engine has loaded and run it.
    assert "Policies:" in res.stdout, _output(res)
    assert f"autoheal@v0.0.1 (local: {POLICY})" in res.stdout, _output(res)


def test_the_lab_stack_passes_the_policy_pack(kubeconfig: Path, preview: Callable[..., Any]) -> None:
    res = preview(_lab_config(kubeconfig))
    _assert_pack_ran(res)
    assert res.returncode == 0, _output(res)
    assert "[mandatory]" not in res.stdout, _output(res)
    assert "to create" in res.stdout, _output(res)


def test_a_pool_without_spares_fails_the_preview(kubeconfig: Path, preview: Callable[..., Any]) -> None:
    cfg = _lab_config(kubeconfig)
    pool = cfg["autoheal:pools"][0]
    pool["spares"] = 0
    pool.pop("waiver", None)
    res = preview(cfg)
    _assert_pack_ran(res)
    assert res.returncode != 0, _output(res)
    assert f"[mandatory]  {POOL_RULE}" in res.stdout, _output(res)
    assert f"GPU pool autoheal-pool-{pool['name']} has no hot spares (spares=0)" in res.stdout, _output(res)
