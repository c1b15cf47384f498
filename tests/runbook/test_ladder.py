"""The recovery ladder end to end on the lab (issue 15): real Slurm jobs that checkpoint, KWOK nodes
in a real kube-apiserver, the simulator as the GPUs (reset, reboot, health with injected failures)
and the lab's pool controller as the cloud. One lab for the module (the runbook tests' session
lab, restarted once); each test leaves its nodes in service, a spare, or retired.

Each rung prints its timings (fault -> job running again, fault -> node back in service); the
figures in docs/runbook.md come from these runs.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.runbook.conftest import AUTOHEAL, run_playbook
from tests.support import wait_for

pytestmark = pytest.mark.lab

SPARE_REASON = "autoheal: hot spare"


def lab_cli(lab: Any, *args: str) -> str:
    res = subprocess.run(
        [AUTOHEAL, "lab", *args, "--name", lab.name, "--root", str(lab.root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, f"autoheal lab {args}: {res.stdout}{res.stderr}"
    return res.stdout


def pause_runner(lab: Any) -> None:
    """The lab's own runner would act on the injected XIDs (its watchers alert) while the test
    runs the plays itself: pause it, as an on-call engineer would before running plays by hand."""
    config = lab.run_dir / "runner" / "runner.yaml"
    if config.exists():
        res = subprocess.run(
            [AUTOHEAL, "pause", "--config", str(config), "--reason", "ladder tests run the plays"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr


def inject(lab: Any, node: str, gpu: int, xid: int) -> float:
    lab_cli(lab, "inject", "--node", node, "--gpu", str(gpu), "--xid", str(xid))
    return time.time()


def healthy(lab: Any, node: str) -> bool:
    return bool(json.loads(lab_cli(lab, "pool", "health", "--peek", "--node", node))["healthy"])


def ladder_vars(
    lab: Any, tmp: Path, node: str, incident: str, xid: int, gpu: int, tier: str, **kw: Any
) -> dict:
    return {
        **lab.base_vars(),
        "autoheal_nodes": [node],
        "autoheal_incident_ids": [incident],
        "autoheal_xid": xid,
        "autoheal_gpu": gpu,
        "autoheal_tier": tier,
        "autoheal_grace_seconds": 20,
        "autoheal_drain_timeout": 30,
        "autoheal_evidence_dir": str(tmp / "evidence"),
        **kw,
    }


def phases(lab: Any, node: str, incident: str | None = None) -> list[tuple[str, str]]:
    """The journal's (phase, status) for `node` (the lab's journal spans the module's tests)."""
    return [
        (e["phase"], e["status"])
        for e in lab.journal_lines()
        if e["node"] == node and incident in (None, e["incident"])
    ]


def phase_ts(lab: Any, node: str, phase: str) -> float:
    return next(e["ts"] for e in lab.journal_lines() if e["node"] == node and e["phase"] == phase)


class JobWatch(threading.Thread):
    """Notes when a job is first RUNNING again after its requeue, while a play runs."""

    def __init__(self, lab: Any, job: int) -> None:
        super().__init__(daemon=True)
        self.lab, self.job = lab, job
        self.running_again: float | None = None
        self.nodes = ""
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set() and self.running_again is None:
            j = self.lab.jobs().get(self.job, {})
            if j.get("job_state") == "RUNNING" and j.get("restart_cnt", 0) >= 1:
                self.running_again, self.nodes = time.time(), j["nodes"]
            self.stop.wait(0.25)


def fence(lab: Any, tmp: Path, extra: dict) -> None:
    res = run_playbook("fence", {k: v for k, v in extra.items() if k in FENCE_INPUTS}, tmp=tmp)
    assert res.rc == 0, res.output[-3000:]


FENCE_INPUTS = {
    "autoheal_nodes",
    "autoheal_incident_ids",
    "autoheal_slurm_conf",
    "autoheal_kubeconfig",
    "autoheal_journal_events",
    "autoheal_lab_name",
    "autoheal_lab_root",
}


def test_xid_79_promotes_the_spare_then_the_node_is_rebooted_validated_and_back_as_a_spare(
    fresh_lab, tmp_path, checkpoint_job
):
    """The job resumes on the promoted spare at once; the bad node is rebooted through the pool
    backend, validated, and returns to the spare set (XID 79 is RESTART_BM first: no retirement)."""
    lab = fresh_lab
    pause_runner(lab)
    script, _ck, log = checkpoint_job
    fillers = [
        lab.sbatch("-N1", "--exclusive", "-w", n, "--no-requeue", "-o", "/dev/null", "--wrap", "sleep 3000")
        for n in ("gpu-3", "gpu-4")
    ]
    job = lab.sbatch("-N2", "--exclusive", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "job started")
        t_fault = inject(lab, "gpu-1", 3, 79)
        assert not healthy(lab, "gpu-1")
        watch = JobWatch(lab, job)
        watch.start()
        extra = ladder_vars(lab, tmp_path, "gpu-1", "inc-000000000079", 79, 3, "reboot")
        res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-6000:]
        running_again: float = wait_for(lambda: watch.running_again, 90, "the requeued job running again")
        watch.stop.set()
        assert watch.nodes in ("gpu-[2,5]", "gpu-2,gpu-5"), watch.nodes

        got = phases(lab, "gpu-1")
        for p in ("fenced", "spare_promoted", "requeued", "evidence", "rebooted", "validated", "returned"):
            assert (p, "ok") in got, got
        assert "retired" not in [p for p, _ in got]
        assert next(e for e in lab.journal_lines() if e["phase"] == "returned")["detail"] == "spare"
        # back in the spare set: drained with exactly the spare reason, not down, GPUs clean
        node = lab.node("gpu-1")
        assert node["reason"] == SPARE_REASON and node["state"] != "down", node
        assert healthy(lab, "gpu-1")
        # gpu-5 no longer stands in for gpu-1: a later failure of gpu-1 takes a new spare
        assert lab.node("gpu-5")["comment"] == "", lab.node("gpu-5")
        if lab.kubeconfig is not None:
            kn = lab.kube_node("gpu-1")
            assert kn["metadata"]["annotations"]["autoheal.io/validation"] == "passed"
            assert kn["metadata"]["labels"].get("autoheal.io/spare") == "true"
            assert "autoheal.io/state" not in kn["metadata"]["labels"]
        # the vendor's bundle was taken before the reboot cleared the kernel log
        bundle = tmp_path / "evidence" / "inc-000000000079-gpu-1.tar.gz"
        with tarfile.open(bundle) as tar:
            names = tar.getnames()
            lines = tar.extractfile("inc-000000000079-gpu-1/xid_lines.txt").read().decode()
            summary = json.loads(tar.extractfile("inc-000000000079-gpu-1/summary.json").read())
        assert "inc-000000000079-gpu-1/metrics.txt" in names
        assert ": 79, " in lines and "fallen off the bus" in lines
        assert (
            summary["xid"] == 79
            and summary["gpus"][3]["uuid"].startswith("GPU-")
            and summary["gpus"][3]["serial"]
        )

        print(
            f"\nXID 79 (reboot rung, hot spare): fault -> job running again {running_again - t_fault:.1f}s, "
            f"fault -> node back in the spare set {phase_ts(lab, 'gpu-1', 'returned') - t_fault:.1f}s"
        )
        # the ladder run again changes nothing: the node is a spare now, not fenced
        again = run_playbook("recover", extra, tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-4000:]
    finally:
        lab.slurm("scancel", str(job), *map(str, fillers), check=False)
        # the lab as the other runbook tests expect it: gpu-1 active, gpu-5 a spare again
        for node, as_ in (("gpu-1", "active"), ("gpu-5", "spare")):
            back = {**lab.base_vars(), "autoheal_nodes": [node], "autoheal_return_as": as_}
            run_playbook("node_return", back, tmp=tmp_path)


def test_restart_app_requeues_the_job_and_the_node_stays_in_service(lab, tmp_path, checkpoint_job):
    pause_runner(lab)
    script, _ck, log = checkpoint_job
    job = lab.sbatch("-N1", "-w", "gpu-2", "--exclusive", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[job]["job_state"] == "RUNNING", 60, "job running")
        wait_for(lambda: log.exists() and "start" in log.read_text(), 30, "job started")
        t_fault = inject(lab, "gpu-2", 0, 13)
        watch = JobWatch(lab, job)
        watch.start()
        extra = ladder_vars(
            lab, tmp_path, "gpu-2", "inc-000000000013", 13, 0, "restart_app", autoheal_fault_time=t_fault
        )
        res = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-5000:]
        running_again: float = wait_for(lambda: watch.running_again, 90, "the requeued job running again")
        watch.stop.set()
        # the job started again on the same node, after the fault: a rerun leaves it alone
        again = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert again.rc == 0 and again.changed == 0, again.output[-4000:]
        assert lab.jobs()[job]["restart_cnt"] == 1 and lab.jobs()[job]["job_state"] == "RUNNING"
        assert ("fenced", "ok") not in phases(lab, "gpu-2")
        assert ("requeued", "ok") in phases(lab, "gpu-2")
        node = lab.node("gpu-2")
        assert not node["reason"] and "DRAIN" not in node["state_flags"], node
        if lab.kubeconfig is not None:
            assert not lab.kube_node("gpu-2")["spec"].get("unschedulable")
        print(
            f"\nXID 13 (restart_app rung): fault -> job running again {running_again - t_fault:.1f}s "
            "(the node never left service)"
        )
    finally:
        lab.slurm("scancel", str(job), check=False)
        lab_cli(lab, "inject", "--node", "gpu-2", "--clear")


def test_reset_rung_returns_a_validated_node_and_check_mode_changes_nothing(lab, tmp_path):
    pause_runner(lab)
    t_fault = inject(lab, "gpu-3", 1, 48)
    extra = ladder_vars(lab, tmp_path, "gpu-3", "inc-000000000048", 48, 1, "reset")
    fence(lab, tmp_path, extra)
    before = (lab.node("gpu-3")["reason"], lab.flags("gpu-3"))
    dry = run_playbook("recover", extra, check=True, tmp=tmp_path)
    assert dry.rc == 0, dry.output[-4000:]
    assert (lab.node("gpu-3")["reason"], lab.flags("gpu-3")) == before
    assert not healthy(lab, "gpu-3"), "check mode reset the GPU"
    res = run_playbook("recover", extra, tmp=tmp_path)
    assert res.rc == 0, res.output[-5000:]
    got = phases(lab, "gpu-3")
    assert [p for p in got if p[0] in ("gpu_reset", "validated", "returned")] == [
        ("gpu_reset", "ok"),
        ("validated", "ok"),
        ("returned", "ok"),
    ], got
    assert "rebooted" not in [p for p, _ in got] and "evidence" not in [p for p, _ in got]
    node = lab.node("gpu-3")
    assert not node["reason"] and "DRAIN" not in node["state_flags"], node
    print(
        f"\nXID 48 (reset rung): fault -> node back in service {phase_ts(lab, 'gpu-3', 'returned') - t_fault:.1f}s"
    )
    again = run_playbook("recover", extra, tmp=tmp_path)
    assert again.rc == 0 and again.changed == 0, again.output[-4000:]


def test_a_hung_reset_climbs_to_a_reboot_and_a_failed_validation_keeps_the_node_out_and_pages(
    lab, tmp_path, sink
):
    """Run by hand (no incident id: no journal the runner reads carries the node's outcome), a node
    the ladder could not bring back fails the play: the exit status pages."""
    pause_runner(lab)
    inject(lab, "gpu-4", 2, 48)
    lab_cli(lab, "pool", "faults", "--node", "gpu-4", "--reset", "hang", "--health-failures", "1")
    extra = ladder_vars(
        lab,
        tmp_path,
        "gpu-4",
        "inc-000000000046",
        48,
        2,
        "reset",
        autoheal_reset_timeout=3,
        autoheal_retire_unrecovered=False,
        autoheal_webhook_url=sink.url,
    )
    by_hand = {k: v for k, v in extra.items() if k != "autoheal_incident_ids"}
    try:
        fence(lab, tmp_path, extra)
        res = run_playbook("recover", by_hand, tmp=tmp_path)
        assert res.rc != 0, "a node that failed validation must page (the run by hand fails)"
        assert "not returned to service: gpu-4" in res.output, res.output[-3000:]
        got = phases(lab, "gpu-4")
        assert ("gpu_reset", "failed") in got and ("climbed", "ok") in got, got
        assert ("evidence", "ok") in got and ("rebooted", "ok") in got
        assert ("validated", "failed") in got and ("recover_failed", "failed") in got
        assert (tmp_path / "evidence" / "manual-gpu-4.tar.gz").is_file()
        assert "returned" not in [p for p, _ in got]
        node = lab.node("gpu-4")
        assert node["reason"].startswith("autoheal:") and node["reason"] != SPARE_REASON, node
        if lab.kubeconfig is not None:
            kn = lab.kube_node("gpu-4")
            assert kn["spec"].get("unschedulable") is True
            assert kn["metadata"]["annotations"]["autoheal.io/validation"] == "failed"
        assert "failed" in sink.events()
        # the injected failure was consumed: validated by hand, the node may return
        lab_cli(lab, "pool", "faults", "--node", "gpu-4", "--reset", "ok")
        again = run_playbook("recover", by_hand, tmp=tmp_path)
        assert again.rc == 0, again.output[-4000:]
        assert ("returned", "ok") in phases(lab, "gpu-4")
    finally:
        lab_cli(lab, "pool", "faults", "--node", "gpu-4", "--reset", "ok", "--health-failures", "0")


def test_an_unknown_xid_is_quarantined_with_evidence_and_pages(lab, tmp_path):
    pause_runner(lab)
    inject(lab, "gpu-3", 5, 999)
    extra = ladder_vars(lab, tmp_path, "gpu-3", "inc-000000000999", 999, 5, "quarantine")
    try:
        fence(lab, tmp_path, extra)
        res = run_playbook("recover", extra, tmp=tmp_path)
        assert res.rc != 0 and "quarantined for a human" in res.output, res.output[-3000:]
        got = phases(lab, "gpu-3", "inc-000000000999")
        assert ("evidence", "ok") in got and not {"gpu_reset", "rebooted", "returned"} & {p for p, _ in got}
        assert lab.node("gpu-3")["reason"].startswith("autoheal:")
        assert (tmp_path / "evidence" / "inc-000000000999-gpu-3.tar.gz").is_file()
    finally:
        lab_cli(lab, "inject", "--node", "gpu-3", "--clear")
        run_playbook("unfence", {k: v for k, v in extra.items() if k in FENCE_INPUTS}, tmp=tmp_path)


def test_a_reboot_that_does_not_fix_the_node_climbs_to_replace(lab, tmp_path, sink):
    """gpu-6 (a spare no other test of the session lab uses) fails its validation after the reboot:
    it is retired through the backend, which backfills the pool, and a human is told. With its
    incident in the journal (as the runner runs it) the node's outcome is its recover_failed event:
    the play ends ok."""
    pause_runner(lab)
    t_fault = inject(lab, "gpu-6", 0, 79)
    lab_cli(lab, "pool", "faults", "--node", "gpu-6", "--health-failures", "1")
    extra = ladder_vars(
        lab, tmp_path, "gpu-6", "inc-000000000791", 79, 0, "reboot", autoheal_webhook_url=sink.url
    )
    fence(lab, tmp_path, extra)
    res = run_playbook("recover", extra, tmp=tmp_path)
    assert res.rc == 0 and "NOT RECOVERED (1 of 1)" in res.output, res.output[-3000:]
    got = phases(lab, "gpu-6")
    assert ("evidence", "ok") in got and ("validated", "failed") in got and ("retired", "ok") in got, got
    assert ("recover_failed", "failed") in got
    detail = next(
        e["detail"] for e in lab.journal_lines() if e["node"] == "gpu-6" and e["phase"] == "recover_failed"
    )
    assert "validation after the reboot failed" in detail and "retired through the backend" in detail, detail
    assert [(b["event"], b["nodes"]) for b in sink.bodies] == [("failed", ["gpu-6"])]
    assert "gpu-6" in lab.pool_status()["retired"]
    print(
        f"\nXID 79, the reboot did not fix it (replace rung): fault -> node retired through the backend "
        f"{phase_ts(lab, 'gpu-6', 'retired') - t_fault:.1f}s"
    )


def test_one_node_of_a_batch_that_fails_validation_fails_alone_and_its_batch_mate_returns(
    lab, tmp_path, sink
):
    """The storm's case (XID 79, reboot rung, a batch): gpu-3 fails its validation after the reboot,
    gpu-2 passes. gpu-2 returns to service and its incident has no failed event; gpu-3 stays
    fenced with recover_failed (what failed, kept fenced, its bundle) and the one `failed`
    notification names it alone; the play ends ok (the runner fails gpu-3's incident only). Both
    bundles come from one module run. Once gpu-3 is fixed, a rerun returns it."""
    from remediation.executor import read_events

    pause_runner(lab)
    incidents = {"gpu-2": "inc-0000000007b2", "gpu-3": "inc-0000000007b3"}
    for n in incidents:
        inject(lab, n, 0, 79)
    lab_cli(lab, "pool", "faults", "--node", "gpu-3", "--health-failures", "1")
    extra = {
        **ladder_vars(lab, tmp_path, "gpu-2", incidents["gpu-2"], 79, 0, "reboot"),
        "autoheal_nodes": list(incidents),
        "autoheal_incident_ids": list(incidents.values()),
        "autoheal_retire_unrecovered": False,
        "autoheal_webhook_url": sink.url,
    }
    try:
        fence(lab, tmp_path, extra)
        res = run_playbook("recover", extra, tmp=tmp_path)
        assert res.rc == 0, res.output[-6000:]
        assert (
            "NOT RECOVERED (1 of 2)" in res.output
            and "gpu-3: validation after the reboot failed" in res.output
        )

        good, bad = phases(lab, "gpu-2", incidents["gpu-2"]), phases(lab, "gpu-3", incidents["gpu-3"])
        assert ("evidence", "ok") in good and ("validated", "ok") in good and ("returned", "ok") in good, good
        assert not [p for p, status in good if status == "failed"], good
        assert ("validated", "failed") in bad and ("recover_failed", "failed") in bad, bad
        assert "returned" not in [p for p, _ in bad] and "retired" not in [p for p, _ in bad]
        failed = next(
            e
            for e in lab.journal_lines()
            if e["incident"] == incidents["gpu-3"] and e["phase"] == "recover_failed"
        )
        bundle = tmp_path / "evidence" / f"{incidents['gpu-3']}-gpu-3.tar.gz"
        assert "validation after the reboot failed" in failed["detail"] and "kept fenced" in failed["detail"]
        assert str(bundle) in failed["detail"] and bundle.is_file()
        # one evidence task for the batch, each node's bundle journaled
        evidence = {
            e["node"]: e["detail"]
            for e in lab.journal_lines()
            if e["incident"] in incidents.values() and e["phase"] == "evidence"
        }
        assert evidence == {n: str(tmp_path / "evidence" / f"{i}-{n}.tar.gz") for n, i in incidents.items()}
        # what the runner reads back: a failed event for gpu-3's incident only
        events, _ = read_events(lab.journal, 0, {i: n for n, i in incidents.items()})
        assert {e.incident for e in events if e.status == "failed"} == {incidents["gpu-3"]}
        # one failure notification, for gpu-3 and its incident only
        assert [(b["event"], b["nodes"], b["incidents"]) for b in sink.bodies if b["event"] == "failed"] == [
            ("failed", ["gpu-3"], [incidents["gpu-3"]])
        ]
        two, three = lab.node("gpu-2"), lab.node("gpu-3")
        assert not two["reason"] and "DRAIN" not in two["state_flags"], two
        assert three["reason"].startswith("autoheal:") and three["reason"] != SPARE_REASON, three

        # gpu-3 fixed (the injected failure was consumed): a rerun returns it, leaves gpu-2 alone
        again = run_playbook("recover", extra, tmp=tmp_path)
        assert again.rc == 0 and "NOT RECOVERED" not in again.output, again.output[-4000:]
        assert ("returned", "ok") in phases(lab, "gpu-3", incidents["gpu-3"])
        assert phases(lab, "gpu-2", incidents["gpu-2"]).count(("returned", "ok")) == 1
    finally:
        for n in incidents:
            lab_cli(lab, "pool", "faults", "--node", n, "--health-failures", "0")
            lab_cli(lab, "inject", "--node", n, "--clear")
        run_playbook("unfence", {k: v for k, v in extra.items() if k in FENCE_INPUTS}, tmp=tmp_path)
