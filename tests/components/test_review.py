"""The GitOps review (review/): a check that did not run fails it and is named, a replacement of
the controller's state volume fails it without an approval marker, and the Markdown summary of a
sample change says what a reviewer needs. The sample change is a real git change in a copy of
the project; the EKS stack is previewed under Pulumi mocks (its cloud is simulated), the lab
stack's preview needs a lab and, here, has none."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from review.model import Status
from review.plan import REPLACE, UPDATE
from review.report import render
from review.run import Options, UsageError, run_review
from tests.components.harness import ROOT

PROJECT_FILES = (
    "Pulumi.yaml",
    "__main__.py",
    "Pulumi.lab.yaml",
    "Pulumi.example-eks.yaml",
    "pyproject.toml",
    "ansible.cfg",
)
PROJECT_DIRS = (
    "components",
    "autoheal",
    "policy",
    "config",
    "playbooks",
    "roles",
    "collections",
    "monitoring",
    "inventory",
)
EKS = "Pulumi.example-eks.yaml"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding this project's stack inputs, committed on `main`, with a branch
    `change` checked out: tests edit files and commit there."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, repo / name)
    for folder in PROJECT_DIRS:
        shutil.copytree(ROOT / folder, repo / folder, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "base")
    _git(repo, "checkout", "-q", "-b", "change")
    return repo


def _edit_stack(repo: Path, stack_file: str, edit: Callable[[dict], None], message: str | None) -> None:
    path = repo / stack_file
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    if message is not None:
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-am", message)


def _options(repo: Path, **kw) -> Options:
    nowhere = repo / "no-lab"
    return Options(
        repo=repo,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"},
        lab_kubeconfig=nowhere / "kubeconfig",
        lab_slurm_conf=nowhere / "slurm.conf",
        venv=Path(sys.prefix),
        base_ref="main",
        **kw,
    )


def _new_state_class(cfg: dict) -> None:
    cfg["autoheal:slurm"]["storage"]["stateStorageClass"] = "io2"


def _bigger_pool(cfg: dict) -> None:
    cfg["autoheal:pools"][1]["size"] = 10


# --- a check that does not run is not a pass -----------------------------------------------


def test_a_review_with_the_lab_down_fails_and_names_what_did_not_run(repo, tmp_path):
    _edit_stack(repo, "Pulumi.lab.yaml", lambda c: c["autoheal:pools"][0].update(spares=3), "more spares")
    review = run_review(_options(repo, only=("preview", "dryrun")), tmp_path / "work")
    status = {c.name: c.status for c in review.checks}
    assert status == {"preview:lab": Status.NOT_RUN, "dryrun": Status.NOT_RUN}
    assert not review.passed
    text = render(review)
    assert text.startswith("## autoheal review: FAILED")
    assert "**Did not run: `preview:lab`, `dryrun`.**" in text
    assert "the lab's Kubernetes API is not reachable" in text and "(start it: autoheal lab up)" in text
    assert "| passed |" not in text


def test_allowed_skips_are_listed_as_skipped_never_as_passed(repo, tmp_path):
    _edit_stack(repo, "Pulumi.lab.yaml", lambda c: c["autoheal:pools"][0].update(spares=3), "more spares")
    opts = _options(repo, only=("preview", "dryrun"), allow_skip=frozenset({"preview:lab", "dryrun"}))
    review = run_review(opts, tmp_path / "work")
    assert {c.status for c in review.checks} == {Status.SKIPPED}
    assert review.passed
    text = render(review)
    assert text.count("skipped (allowed)") == 2 and "| passed |" not in text


def test_the_cli_exits_1_when_a_check_did_not_run_and_2_on_a_bad_option(repo):
    _edit_stack(repo, "Pulumi.lab.yaml", lambda c: c["autoheal:pools"][0].update(spares=3), "more spares")
    cmd = [
        sys.executable,
        "-m",
        "review",
        "--base",
        "main",
        "--lab-dir",
        str(repo / "no-lab"),
        "--only",
        "preview",
    ]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 1, res.stderr
    assert "| **NOT RUN** |" in res.stdout
    bad = subprocess.run([*cmd, "--allow-skip", "preveiw"], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=300, check=False)  # fmt: skip
    assert bad.returncode == 2 and "--allow-skip preveiw: not a check" in bad.stderr


def test_an_unknown_stack_is_a_usage_error(repo, tmp_path):
    with pytest.raises(UsageError, match=re.escape("no Pulumi.<stack>.yaml for ['prod']")):
        run_review(_options(repo, stacks=("prod",), only=("preview",)), tmp_path / "work")


# --- which stacks a change touches ---------------------------------------------------------


def test_only_the_stacks_whose_inputs_changed_are_previewed(repo, tmp_path):
    from review import changes

    _edit_stack(repo, EKS, _bigger_pool, "bigger a100 pool")
    change = changes.describe_change(repo, "main")
    assert change.files == (EKS,)
    assert changes.touched_stacks(repo, change.files) == {"example-eks": [EKS]}
    (repo / "playbooks" / "gpu_fatal_xid.yml").write_text("# edited, not committed\n")
    touched = changes.touched_stacks(repo, changes.describe_change(repo, "main").files)
    assert set(touched) == {"example-eks", "lab"}  # both ship the runbook to their runner
    (repo / "components" / "extra.py").write_text("")  # untracked, not ignored: a shared input
    assert "components/extra.py" in changes.describe_change(repo, "main").files


# --- stateful replacements need an approval marker ------------------------------------------


def test_replacing_the_controllers_state_volume_fails_without_the_approval_marker(repo, tmp_path):
    _edit_stack(repo, EKS, _new_state_class, "faster state volume for slurmctld")
    review = run_review(_options(repo, only=("preview",)), tmp_path / "work")
    (preview,) = review.previews
    replaced = {s.name: s for s in preview.plan.of(REPLACE)}
    assert set(replaced) == {"slurm-slurmctld"}
    assert "spec.volumeClaimTemplates" in replaced["slurm-slurmctld"].keys
    (flag,) = preview.flags
    assert (flag.step.name, flag.approved) == ("slurm-slurmctld", False)
    assert flag.what == "the Slurm controller's state volume (job queue, node states)"
    assert [c.status for c in review.checks] == [Status.PASSED]  # the preview itself ran clean
    assert not review.passed  # ... but the replacement is not approved
    assert "`Autoheal-Approve: slurm-slurmctld`" in render(review)


def test_the_approval_marker_in_a_commit_lets_the_replacement_pass(repo, tmp_path):
    _edit_stack(repo, EKS, _new_state_class, "faster state volume\n\nAutoheal-Approve: slurm-slurmctld\n")
    review = run_review(_options(repo, only=("preview",)), tmp_path / "work")
    (flag,) = review.previews[0].flags
    assert flag.approved and review.passed


def test_an_approval_for_another_resource_does_not_count(repo, tmp_path):
    _edit_stack(repo, EKS, _new_state_class, "faster state volume")
    review = run_review(
        _options(repo, only=("preview",), approvals=frozenset({"runner-journal"})), tmp_path / "w"
    )
    assert not review.passed


def test_deleting_a_node_pool_is_flagged(repo, tmp_path):
    _edit_stack(repo, EKS, lambda c: c["autoheal:pools"].pop(), "drop the a100 pool")
    review = run_review(_options(repo, only=("preview",)), tmp_path / "work")
    flagged = {(f.step.op, f.step.name) for f in review.previews[0].flags}
    assert ("delete", "pool-a100-nodegroup") in flagged
    assert ("delete", "pool-a100-pool") in flagged
    assert not review.passed


# --- the Markdown summary of a sample change ------------------------------------------------


def test_markdown_summary_of_a_sample_change(repo, tmp_path):
    """The sample: the a100 pool grows to 10 nodes and the controller's state moves to io2."""

    def edit(cfg: dict) -> None:
        _bigger_pool(cfg)
        _new_state_class(cfg)

    _edit_stack(repo, EKS, edit, "a100 pool 10 nodes; slurmctld state on io2")
    review = run_review(_options(repo, only=("preview",)), tmp_path / "work")
    text = render(review)
    lines = text.splitlines()
    assert lines[0] == "## autoheal review: FAILED"
    assert f"Change against the merge base `{review.base}` of `main`. Stacks touched: `example-eks`." in lines
    assert "| `preview:example-eks` preview of `example-eks` with the policy pack | passed | " in text
    assert "1 to replace" in text and "1 stateful changes need approval" in text
    assert (
        "| example-eks | **REPLACE** | `slurm-slurmctld` | the Slurm controller's state volume "
        "(job queue, node states) | **no** |" in lines
    )
    steps = [line for line in lines if line.startswith(("| **REPLACE**", "| update", "| create"))]
    assert steps[0] == (
        "| **REPLACE** | `slurm-slurmctld` | `kubernetes:apps/v1:StatefulSet` | spec.volumeClaimTemplates |"
    )
    updated = {line.split("|")[2].strip() for line in steps[1:]}
    # The bigger pool: its description, its node group, Slurm's generated config, the pods that
    # roll with it (the config hash on their templates; every pool's slurmd DaemonSet too, whose
    # OnDelete pods wait for playbooks/slurm_rollout.yml) and how many Ready slurmd pods
    # `pulumi up` waits for (the DaemonSet's waitFor annotation), and the runner's copy of
    # slurm.conf (its Slurm client must know the new partition's nodes too).
    assert updated == {
        "`pool-a100-pool`",
        "`pool-a100-nodegroup`",
        "`slurm-config`",
        "`slurm-login`",
        "`slurm-slurmd-a100`",
        "`slurm-slurmd-h100`",
        "`runner-slurm`",
    }
    assert "### Policy violations\n\nNone." in text
    assert {s.op for s in review.previews[0].plan.steps if s.name != "slurm-slurmctld"} == {UPDATE}


# --- a change that leaves pods without a node fails before merge ----------------------------


def test_a_change_that_leaves_the_gpu_pods_without_a_device_plugin_fails_the_schedule_check(repo, tmp_path):
    """`devicePlugin: none` on EKS: no node advertises nvidia.com/gpu, so slurmd cannot bind; the
    review's schedule check (lab.schedulable, the real scheduler) says so, pod by pod."""
    _edit_stack(repo, EKS, lambda c: c["autoheal:cluster"]["eks"].update(devicePlugin="none"), "no plugin")
    review = run_review(_options(repo, only=("schedule",)), tmp_path / "work")
    (check,) = review.checks
    assert (check.name, check.status) == ("schedule:example-eks", Status.FAILED), check.detail
    assert "Insufficient nvidia.com/gpu" in check.detail and "slurm/slurmd-" in check.detail
    assert not review.passed
