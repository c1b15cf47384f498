"""The review against a real lab: the lab stack previewed by the real Pulumi engine with the
policy pack (the merge base deployed into the lab first), and the runbook's check-mode run
against the lab's real slurmctld and Kubernetes API.

One lab (Slurm, a Kubernetes control plane with KWOK nodes, no runner) is started for the module
in a temporary root and always torn down; the project is a git copy (tests.components.
test_review's `repo`), so the review sees a real change. Needs Slurm and the Go-built tools; a
missing tool fails, never skips.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.pulumi_env import pulumi_env
from review.model import Status
from review.plan import REPLACE
from review.report import render
from review.run import Options, run_review
from tests.components.test_review import _edit_stack, repo  # noqa: F401 (the fixture)
from tests.support import port_base

pytestmark = [pytest.mark.kube, pytest.mark.pulumi, pytest.mark.lab]

PORT_BASE = port_base(28600)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    cfg = LabConfig(
        name="review",
        root=tmp_path_factory.mktemp("review-labs"),
        port_base=PORT_BASE,
        pools=[PoolConfig(size=4, spares=2, headroom=2)],
        runner=False,
        grace_seconds=10,
        provision_delay=1,
    )
    try:
        labmod.up(cfg)
        yield cfg
    finally:
        labmod.down(cfg)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's Pulumi state, one for the module as a lab has one (scripts/review.sh: its run dir)."""
    return tmp_path_factory.mktemp("review-lab-pulumi")


def _options(repo: Path, lab: LabConfig, state: Path, **kw) -> Options:  # noqa: F811
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return Options(
        repo=repo,
        env=pulumi_env(state, base={**os.environ, "PATH": path}),
        lab_kubeconfig=lab.kubeconfig,
        lab_slurm_conf=lab.slurm_conf,
        venv=Path(sys.prefix),
        base_ref="main",
        **kw,
    )


def _state_class(cfg: dict) -> None:
    cfg["autoheal:slurm"]["storage"] = {"stateStorageClass": "fast"}


def test_replacing_the_state_volume_in_the_lab_fails_without_approval(repo, lab, state, tmp_path):  # noqa: F811
    _edit_stack(repo, "Pulumi.lab.yaml", _state_class, "slurmctld state on the fast class")
    review = run_review(_options(repo, lab, state, only=("preview",)), tmp_path / "work")
    (preview,) = review.previews
    assert preview.baseline.startswith("the merge base") and "deployed into the lab" in preview.baseline
    assert preview.how.startswith("real Pulumi engine")
    replaced = {s.name: s for s in preview.plan.of(REPLACE)}
    assert set(replaced) == {"slurm-slurmctld"}, render(review)
    assert any("volumeClaimTemplates" in k for k in replaced["slurm-slurmctld"].keys)
    assert [f.step.name for f in preview.flags if not f.approved] == ["slurm-slurmctld"]
    # Mandatory findings fail a review, advisory ones do not. images-pinned-by-digest is mandatory
    # and passes: Pulumi.lab.yaml names every image by digest (its KWOK nodes pull none).
    mandatory = [v for v in preview.violations if v.level != "advisory"]
    assert mandatory == [] and preview.errors == [], render(review)
    assert not [v for v in preview.violations if v.rule == "images-pinned-by-digest"], render(review)
    assert not review.passed
    # The same change approved: the replacement passes (the lab keeps the merge base's state).
    approved = run_review(
        _options(repo, lab, state, only=("preview",), approvals=frozenset({"slurm-slurmctld"})),
        tmp_path / "w2",
    )
    assert approved.passed, render(approved)


def test_a_pool_without_spares_is_a_policy_violation_from_the_pack(repo, lab, state, tmp_path):  # noqa: F811
    _edit_stack(repo, "Pulumi.lab.yaml", lambda c: c["autoheal:pools"][0].update(spares=0), "no spares")
    review = run_review(_options(repo, lab, state, only=("preview",)), tmp_path / "work")
    (preview,) = review.previews
    rules = {(v.rule, v.resource.split("::")[-1]) for v in preview.violations}
    assert ("gpu-pool-spares-and-remediation", "pool-h100-pool") in rules, render(review)
    assert review.checks[0].status == Status.FAILED and not review.passed
    assert "| `gpu-pool-spares-and-remediation` | `pool-h100-pool` |" in render(review)


def test_the_check_mode_run_names_the_drained_node_and_the_promoted_spare(repo, lab, state, tmp_path):  # noqa: F811
    review = run_review(_options(repo, lab, state, only=("dryrun",)), tmp_path / "work")
    (check,) = review.checks
    assert check.status == Status.PASSED, check.detail
    plan = review.dryrun
    assert plan is not None
    assert plan.drained == ["gpu-1"] and plan.quarantined == ["gpu-1"]
    assert plan.promotions == [("gpu-1", "gpu-5")]
    text = render(review)
    assert "- drained in Slurm (fence): `gpu-1`" in text
    assert "- hot spares promoted: `gpu-5` for `gpu-1`" in text
    # check mode: nothing changed in the lab
    env = {**os.environ, **lab.slurm_env()}
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-n", "gpu-1", "-o", "%T"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0 and "drain" not in out.stdout.lower(), out
