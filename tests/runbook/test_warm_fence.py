"""The warm fence (remediation/warmfence.py): the play's own fence step, rendered from
gpu_fatal_xid.yml and run without a play's start-up. Proof that the play stays the one definition
of a fence: after the warm fence, the play's fence task finds nothing to change."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from remediation.warmfence import WarmFence
from tests.runbook.conftest import REPO, in_fresh_interpreter, run_playbook, trap_job_script
from tests.runbook.test_playbooks import fault_vars
from tests.support import wait_for

FENCE_TASK = "TASK [Fence - Slurm drain, Kubernetes quarantine (cordon, taint, label) and SIGTERM to the jobs, concurrently]"


@pytest.fixture
def warm() -> Any:
    fence = WarmFence(REPO, timeout=60)
    fence.start()
    yield fence
    fence.close()


def test_the_warm_fence_fences_as_the_play_does_and_the_play_then_changes_nothing(
    lab: Any, tmp_path: Path, warm: WarmFence
) -> None:
    events = tmp_path / "events.jsonl"
    extra = {
        **fault_vars(lab, "gpu-4", "inc-warm", autoheal_backend="none"),
        "autoheal_journal_events": str(events),
    }
    try:
        res = warm.fence(extra)
        assert res.ok and res.changed, res.error
        node = lab.node("gpu-4")
        assert "DRAIN" in node["state_flags"] and node["reason"] == "autoheal: XID 79 gpu3 inc-warm", node
        lines = [json.loads(x) for x in events.read_text().splitlines()]
        assert [(e["incident"], e["node"], e["phase"], e["status"]) for e in lines] == [
            ("inc-warm", "gpu-4", "fenced", "ok")
        ]
        if lab.kubeconfig is not None:
            kn = lab.kube_node("gpu-4")
            assert kn["spec"].get("unschedulable") is True
            assert kn["metadata"]["labels"]["autoheal.io/state"] == "quarantined"
        again = warm.fence(extra)  # warm now: no import, no start-up
        assert again.ok and not again.changed, again.error
        print(f"\n[warm fence] first {res.seconds:.2f}s (process start included), again {again.seconds:.2f}s")

        # the play's fence step, from the same YAML, finds the nodes fenced
        play = run_playbook("gpu_fatal_xid", {**extra, "autoheal_stop_after": "fenced"}, tmp=tmp_path)
        assert play.rc == 0, play.output[-4000:]
        status = re.search(r"^(ok|changed): \[localhost\]", play.output.split(FENCE_TASK, 1)[1], re.M)
        assert status and status.group(1) == "ok", play.output.split(FENCE_TASK, 1)[1][:600]
    finally:
        back = {**lab.base_vars(), "autoheal_nodes": ["gpu-4"], "autoheal_incident_ids": ["inc-warm"]}
        run_playbook("node_return", back, tmp=tmp_path)


def test_bad_input_is_refused_and_a_dead_process_is_replaced(
    lab: Any, tmp_path: Path, warm: WarmFence
) -> None:
    before = lab.node("gpu-4")
    bad = warm.fence({**fault_vars(lab, "gpu-4\n", "inc-bad"), "autoheal_journal_events": ""})
    assert not bad.ok and "gpu-4" in bad.error, bad
    after = lab.node("gpu-4")
    assert after["reason"] == before["reason"] and "DRAIN" not in after["state_flags"], after
    missing = warm.fence({"autoheal_nodes": ["gpu-4"]})  # no xid, no incident: the spec says what
    assert not missing.ok and "autoheal_xid" in missing.error, missing

    (pid,) = warm.pids()
    os.kill(pid, 9)
    wait_for(lambda: not warm.pids(), 10, "the warm fence process to die")
    unknown = warm.fence({**fault_vars(lab, "gpu-999", "inc-gone"), "autoheal_journal_events": ""})
    assert unknown.ok, unknown.error  # a new process answered; an unknown node is reported, not fenced
    assert warm.pids() and warm.pids() != [pid]


def test_two_warm_processes_fence_two_batches_side_by_side(lab: Any, tmp_path: Path) -> None:
    """A storm's second batch is not queued behind the first: each slot has its own process."""
    import threading

    fence = WarmFence(REPO, timeout=60, processes=2)
    fence.start()
    try:
        assert len(set(fence.pids())) == 2
        results: dict[str, Any] = {}

        def one(node: str) -> None:
            results[node] = fence.fence(
                {**fault_vars(lab, node, f"inc-{node}"), "autoheal_journal_events": ""}
            )

        threads = [threading.Thread(target=one, args=(n,)) for n in ("gpu-999", "gpu-998")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert all(r.ok for r in results.values()) and len(results) == 2, results
        assert len(set(fence.pids())) == 2  # both still warm
    finally:
        fence.close()
    assert fence.pids() == []


def test_the_warm_fence_signals_the_jobs_once_and_the_play_still_requeues_them(
    lab: Any, tmp_path: Path, warm: WarmFence
) -> None:
    """Issue 18: SIGTERM at the warm fence, ~2 s before the play's fence step, and the requeue the
    moment the job has left, before the play even starts. The play's steps find both in the
    run's signal ledger: the job is signalled once, requeued once, and reported requeued."""
    script, log = trap_job_script(tmp_path)
    events, ledger = tmp_path / "events.jsonl", tmp_path / "signalled.json"
    extra = {
        **fault_vars(lab, "gpu-4", "inc-sig", autoheal_backend="none"),
        "autoheal_journal_events": str(events),
        "autoheal_signal_ledger": str(ledger),
    }
    a = lab.sbatch("-N1", "-w", "gpu-4", "--requeue", "-o", "/dev/null", str(script))
    try:
        wait_for(lambda: lab.jobs()[a]["job_state"] == "RUNNING", 30, "the job to run")
        res = warm.fence(extra)
        assert res.ok and res.changed, res.error
        wait_for(lambda: log.exists() and log.read_text().split() == ["TERM", str(a)], 10, "the trap")
        assert list(json.loads(ledger.read_text())["signalled"]) == [str(a)]
        wait_for(lambda: lab.jobs()[a]["job_state"] not in ("RUNNING", "COMPLETING"), 15, "the job to leave")

        # the warm path also requeued it the moment it left, before any play ran
        requeued = wait_for(lambda: json.loads(ledger.read_text()).get("requeued"), 15, "the warm requeue")
        assert list(requeued) == [str(a)] and lab.jobs()[a]["restart_cnt"] == 1

        play = run_playbook("gpu_fatal_xid", extra, tmp=tmp_path)
        assert play.rc == 0, play.output[-4000:]
        assert log.read_text().split() == ["TERM", str(a)], "signalled twice"
        job = lab.jobs()[a]
        assert job["restart_cnt"] == 1 and job["job_state"] in ("PENDING", "RUNNING"), "requeued twice"
        phases = [(e["phase"], e["status"]) for e in map(json.loads, events.read_text().splitlines())]
        assert ("requeued", "ok") in phases, phases
    finally:
        lab.slurm("scancel", str(a), check=False)
        back = {**lab.base_vars(), "autoheal_nodes": ["gpu-4"], "autoheal_incident_ids": ["inc-sig"]}
        run_playbook("node_return", back, tmp=tmp_path)


def test_a_storm_batch_is_fenced_on_the_warm_path_without_signalling(tmp_path: Path) -> None:
    """Up to WARM_SIGNAL_MAX_NODES nodes the warm path signals the jobs; a bigger batch (a storm)
    is only fenced there, so the fence-only runs queued behind it are not held up. Rendered in a
    fresh interpreter, as the warm fence process does (it installs the collection loader)."""
    from remediation.warmfence import WARM_SIGNAL_MAX_NODES

    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from remediation.warmfence import _Renderer\n"
        "r = _Renderer(Path(sys.argv[1]))\n"
        "for n in map(int, sys.argv[3:]):\n"
        "    extra = {'autoheal_nodes': [f'gpu-{i}' for i in range(1, n + 1)],\n"
        "             'autoheal_incident_ids': [f'inc-{i:012x}' for i in range(1, n + 1)],\n"
        "             'autoheal_xid': 79, 'autoheal_tier': 'reboot', 'autoheal_backend': 'none',\n"
        "             'autoheal_journal_events': sys.argv[2]}\n"
        "    print(json.dumps(r.args(extra)[0]['signal_jobs']))\n"
    )
    sizes = [1, WARM_SIGNAL_MAX_NODES, WARM_SIGNAL_MAX_NODES + 1]
    one, most, storm = in_fresh_interpreter(code, str(tmp_path / "events.jsonl"), *map(str, sizes))[-3:]
    assert one == ["gpu-1"] and len(most) == WARM_SIGNAL_MAX_NODES and storm == []
