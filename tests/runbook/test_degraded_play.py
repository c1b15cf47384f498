"""playbooks/gpu_degraded.yml on the lab's real Slurm (and Kubernetes when built), issue 36: a degraded
node is DRAINED, not DOWN - its running job keeps running and finishes, no job is signalled or
requeued - and cordoned with autoheal's taint, label and annotation; the second run changes
nothing; check mode changes nothing; an administrator's reason is kept. Prints fault -> DRAINING
and job end -> DRAINED."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.runbook.conftest import GRACE, Lab, _kube_built, _lab_cmd, run_playbook
from tests.runbook.test_playbooks import quarantine_taint, snapshot
from tests.support import port_base, wait_for

LAB_NAME = "degraded"
PORT_BASE = port_base(22600)
INC = "inc-0d0d0d0d0d0d"


@pytest.fixture(scope="module")
def dlab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    import shutil

    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    root = tmp_path_factory.mktemp("deglabs")
    journal = tmp_path_factory.mktemp("degjournal") / "events.jsonl"
    lab = Lab(LAB_NAME, root, root / LAB_NAME / "slurm" / "slurm.conf", None, root / LAB_NAME, journal)
    res = _lab_cmd(
        "up", "--name", LAB_NAME, "--root", str(root), "--port-base", str(PORT_BASE), "--grace", str(GRACE)
    )
    try:
        assert res.returncode == 0, f"autoheal lab up failed: {res.stdout}\n{res.stderr}"
        kc = lab.run_dir / "kubeconfig"
        lab.kubeconfig = kc if kc.exists() else None
        # with the tools built the lab has Kubernetes: the cordon is then checked for real
        assert lab.kubeconfig is not None or not _kube_built()
        yield lab
    finally:
        _lab_cmd("down", "--name", LAB_NAME, "--root", str(root), timeout=120)


def _job(lab: Lab, node: str, tmp: Path) -> tuple[int, Path]:
    """A job on `node` that runs until its stop file appears, then ends on its own (COMPLETED)."""
    stop = tmp / f"stop-{node}"
    script = tmp / f"job-{node}.sh"
    script.write_text(f"#!/bin/sh\nwhile [ ! -e {stop} ]; do sleep 0.2; done\nexit 0\n")
    script.chmod(0o755)
    job = lab.sbatch("-w", node, "-N1", "-o", "/dev/null", str(script))
    wait_for(
        lambda: lab.jobs()[job]["job_state"] == ["RUNNING"] or lab.jobs()[job]["job_state"] == "RUNNING", 60
    )
    return job, stop


def _state(job: dict[str, Any]) -> str:
    s = job["job_state"]
    return str(s[0] if isinstance(s, list) else s)


def _node_state(node: dict[str, Any]) -> str:
    """The base state (sinfo --json: "idle" on 22.05, ["IDLE", "DRAIN"] on later releases)."""
    s = node["state"]
    return str(s[0] if isinstance(s, list) else s).upper()


def _vars(lab: Lab, node: str, **extra: Any) -> dict[str, Any]:
    return {
        **lab.base_vars(),
        "autoheal_nodes": [node],
        "autoheal_incident_ids": [INC],
        "autoheal_xid": 0,
        "autoheal_tier": "drain",
        **extra,
    }


def _resume(lab: Lab, node: str) -> None:
    lab.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    if lab.kubeconfig is not None:
        lab.kubectl("uncordon", node, check=False)
        lab.kubectl("taint", "node", node, "autoheal.io/quarantine-", check=False)


def test_a_degraded_node_drains_while_its_job_runs_to_the_end(dlab: Lab, tmp_path: Path) -> None:
    lab, node = dlab, "gpu-2"
    job, stop = _job(lab, node, tmp_path)
    try:
        t0 = time.monotonic()
        res = run_playbook("gpu_degraded", _vars(lab, node), tmp=tmp_path)
        assert res.rc == 0, res.output[-4000:]
        wait_for(lambda: "DRAIN" in lab.flags(node), 30, "DRAIN")
        to_draining = time.monotonic() - t0
        n = lab.node(node)
        assert n["reason"] == f"autoheal: degraded drain {INC}"
        assert _node_state(n) in ("ALLOCATED", "MIXED") and "DOWN" not in n["state_flags"]  # DRAINING
        assert _state(lab.jobs()[job]) == "RUNNING"  # the job was not signalled, killed or requeued
        assert lab.jobs()[job]["restart_cnt"] == 0
        if lab.kubeconfig is not None:
            print("\n(checked in Kubernetes too)")
            kn = lab.kube_node(node)
            assert kn is not None and kn["spec"]["unschedulable"] is True
            assert [t["value"] for t in quarantine_taint(kn)] == ["drain"]
            assert kn["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
            assert kn["metadata"]["annotations"]["autoheal.io/incident"] == INC
        phases = [(e["phase"], e["status"]) for e in lab.journal_lines() if e["incident"] == INC]
        assert phases == [("fenced", "ok"), ("done", "ok")]

        # the second run changes nothing (and says so)
        before = snapshot(lab)
        again = run_playbook("gpu_degraded", _vars(lab, node), tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-4000:]
        assert snapshot(lab) == before

        # the job ends on its own; the node is then DRAINED, still ours
        t1 = time.monotonic()
        stop.touch()
        wait_for(lambda: job not in lab.jobs() or _state(lab.jobs()[job]) == "COMPLETED", 60, "job end")
        wait_for(lambda: _node_state(lab.node(node)) == "IDLE", 60, "the node idle")
        to_drained = time.monotonic() - t1
        n = lab.node(node)
        assert "DRAIN" in n["state_flags"]  # DRAINED
        assert n["reason"] == f"autoheal: degraded drain {INC}"
        print(f"\nfault -> DRAINING (job RUNNING): {to_draining:.2f}s; job end -> DRAINED: {to_drained:.2f}s")

        # idle: validated (the simulator's health check) and returned - Slurm resumed, uncordoned
        t2 = time.monotonic()
        res = run_playbook("degraded_return", _vars(lab, node, autoheal_fault="link_flap"), tmp=tmp_path)
        assert res.rc == 0, res.output[-4000:]
        took = time.monotonic() - t2
        n = lab.node(node)
        assert "DRAIN" not in n["state_flags"] and _node_state(n) == "IDLE" and n["reason"] == "", n
        if lab.kubeconfig is not None:
            kn = lab.kube_node(node)
            assert kn is not None and not kn["spec"].get("unschedulable") and quarantine_taint(kn) == []
            assert "autoheal.io/state" not in kn["metadata"]["labels"]
        phases = [(e["phase"], e["status"]) for e in lab.journal_lines() if e["incident"] == INC]
        assert phases[-2:] == [("validated", "ok"), ("returned", "ok")]
        # a second run finds the node back in service: it is left alone, and says so
        before = snapshot(lab)
        again = run_playbook("degraded_return", _vars(lab, node), tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-4000:]
        assert snapshot(lab) == before
        phases = [(e["phase"], e["status"]) for e in lab.journal_lines() if e["incident"] == INC]
        assert phases[-1] == ("return_skipped", "ok")
        print(f"idle -> validated and returned (the play): {took:.2f}s")
    finally:
        stop.touch()
        _resume(lab, node)


def test_a_degraded_node_that_fails_validation_climbs_to_quarantine(dlab: Lab, tmp_path: Path) -> None:
    """The next rung of a degraded fault: the node stays drained, its reason says quarantine, the
    quarantine taint, and the play reports the failed validation (the runner fails the incident
    and pages). A busy node is not validated at all."""
    from tests.runbook.test_ladder import lab_cli

    lab, node, inc = dlab, "gpu-5", "inc-0f0f0f0f0f0f"
    res = run_playbook("gpu_degraded", _vars(lab, node, autoheal_incident_ids=[inc]), tmp=tmp_path)
    assert res.rc == 0, res.output[-4000:]
    lab_cli(lab, "pool", "faults", "--node", node, "--health-failures", "1")
    try:
        res = run_playbook(
            "degraded_return",
            _vars(lab, node, autoheal_incident_ids=[inc], autoheal_fault="nic_errors"),
            tmp=tmp_path,
        )
        assert res.rc == 0, res.output[-4000:]
        n = lab.node(node)
        assert "DRAIN" in n["state_flags"] and n["reason"] == f"autoheal: degraded quarantine {inc}", n
        if lab.kubeconfig is not None:
            kn = lab.kube_node(node)
            assert kn is not None and kn["spec"]["unschedulable"] is True
            assert [t["value"] for t in quarantine_taint(kn)] == ["quarantine"]
        events = [e for e in lab.journal_lines() if e["incident"] == inc]
        phases = [(e["phase"], e["status"]) for e in events]
        assert phases[2:] == [("validated", "failed"), ("quarantined", "ok")]
        assert "injected diagnostic failure" in next(e["detail"] for e in events if e["phase"] == "validated")
    finally:
        lab_cli(lab, "pool", "faults", "--node", node, "--health-failures", "0")
        _resume(lab, node)


def test_check_mode_changes_nothing_and_an_admins_reason_is_kept(dlab: Lab, tmp_path: Path) -> None:
    lab = dlab
    before = snapshot(lab)
    res = run_playbook("gpu_degraded", _vars(lab, "gpu-3"), check=True, tmp=tmp_path)
    assert res.rc == 0, res.output[-4000:]
    assert snapshot(lab) == before
    lab.slurm("scontrol", "update", "nodename=gpu-4", "state=drain", "reason=bad dimm, ticket 881")
    try:
        res = run_playbook("gpu_degraded", _vars(lab, "gpu-4", autoheal_tier="quarantine"), tmp=tmp_path)
        assert res.rc == 0, res.output[-4000:]
        assert lab.node("gpu-4")["reason"] == "bad dimm, ticket 881"
        if lab.kubeconfig is not None:
            kn = lab.kube_node("gpu-4")
            assert kn is not None and [t["value"] for t in quarantine_taint(kn)] == ["quarantine"]
    finally:
        _resume(lab, "gpu-4")


def test_a_node_unknown_everywhere_is_gone_not_a_failure(dlab: Lab, tmp_path: Path) -> None:
    lab = dlab
    res = run_playbook(
        "gpu_degraded", _vars(lab, "gpu-99", autoheal_incident_ids=["inc-0e0e0e0e0e0e"]), tmp=tmp_path
    )
    assert res.rc == 0, res.output[-4000:]
    phases = [(e["phase"], e["status"]) for e in lab.journal_lines() if e["incident"] == "inc-0e0e0e0e0e0e"]
    assert phases == [("gone", "skipped")]


def test_the_link_flap_demo_tells_the_whole_story_on_this_lab(dlab: Lab, tmp_path: Path) -> None:
    """`autoheal lab demo --fault link-flap` (lab/degraded_demo.py) on this lab's runner, a short
    job: every phase seen, in order - the drain while the job ran and stepped, its end, the
    validation, the return - and the report written."""
    from rich.console import Console

    from lab import degraded_demo
    from lab import lab as labmod

    cfg = labmod.require(LAB_NAME, dlab.root)
    report = degraded_demo.story(cfg, tmp_path / "demo", Console(quiet=True), timeout=120, steps=150)
    phases = {p["phase"]: p for p in report["phases"]}
    assert set(phases) == {k for k, _ in degraded_demo.PHASES}, sorted(phases)
    order = ["injected", "draining", "job_end", "validation_queued", "validated", "returned"]
    assert [phases[k]["t"] for k in order] == sorted(phases[k]["t"] for k in order)
    assert phases["stepping"]["step"] > phases["draining"]["step"]  # trained on while DRAINING
    assert phases["job_end"]["step"] == 150
    assert (tmp_path / "demo" / "report.json").exists()
    print(
        f"\nlink-flap demo: DRAINING +{phases['draining']['t']:.1f}s, returned +{phases['returned']['t']:.1f}s"
    )
