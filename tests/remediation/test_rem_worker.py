"""The worker with real ansible-runner and the stub playbooks: what runs, what is recorded."""

from __future__ import annotations

import fcntl
import json
import time

import pytest
from starlette.testclient import TestClient

from remediation.app import create_app
from remediation.manual import request_cancel, reset_breaker, run_by_hand, set_paused
from remediation.policy import breaker_state
from tests.remediation.remhelp import AUTH, alert, effect_lines, payload
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def serve(runtime_factory):
    """Start a runtime with its worker; yields (runtime, client)."""
    clients = []

    def start(**overrides):
        rt = runtime_factory(**overrides)
        client = TestClient(create_app(rt))
        client.__enter__()
        clients.append(client)
        return rt, client

    yield start
    for c in clients:
        c.__exit__(None, None, None)


def _closed(rt, n):
    return lambda: len(rt.journal.incidents(["completed", "failed", "cancelled", "quarantined"])) >= n


def _extravars(rt, run_id):
    run = rt.journal.run(run_id)
    from pathlib import Path

    return json.loads((Path(run.private_dir) / "env" / "extravars").read_text())


def test_incident_runs_the_play_and_records_timeline_steps_and_metrics(serve, effects):
    rt, client = serve(
        play_vars={"autoheal_slurm_conf": "/etc/slurm/slurm.conf", "autoheal_grace_seconds": 60}
    )
    r = client.post("/webhook", json=payload(alert("gpu-1", xid=79, gpu=3)), headers=AUTH)
    [iid] = r.json()["created"]
    wait_for(_closed(rt, 1), 90, "incident to close")
    inc = rt.journal.incident(iid)
    assert inc.state == "completed", inc.reason
    phases = [(t.phase, t.status) for t in rt.journal.timeline(iid)]
    assert phases[0] == ("received", "ok") and phases[-1] == ("resolved", "ok")
    done = rt.journal.done_phases(iid)
    assert done == ["fenced", "jobs_signalled", "requeued", "drained", "replacement_ready"]
    [run] = rt.journal.runs_of(iid)
    assert run.status == "successful" and run.rc == 0 and run.play_pid
    assert {s["task"] for s in rt.journal.steps(run.id)} >= {"Run the phases"}
    ev = _extravars(rt, run.id)
    assert ev["autoheal_nodes"] == ["gpu-1"] and ev["autoheal_incident_ids"] == [iid]
    assert (ev["autoheal_xid"], ev["autoheal_gpu"], ev["autoheal_tier"]) == (79, 3, "reboot")
    assert ev["autoheal_opt_out"] is False and ev["autoheal_dry_run"] is False
    assert ev["autoheal_grace_seconds"] == 5  # the rule's value wins over the runner's
    assert ev["autoheal_slurm_conf"] == "/etc/slurm/slurm.conf"
    assert effect_lines(effects)[0] == "fenced gpu-1"
    text = client.get("/metrics").text
    assert 'autoheal_incidents_total{outcome="completed",tier="reboot"} 1.0' in text
    assert 'autoheal_incident_phase_duration_seconds_count{phase="fenced"} 1.0' in text
    assert 'autoheal_playbook_runs_total{status="successful"} 1.0' in text


def test_storm_larger_than_budget_trips_breaker_and_runs_no_more_than_budget(serve, effects):
    rt, client = serve(budgets={"max_nodes": 3, "max_pool_percent": 100}, batch_window_seconds=0.3)
    storm = [alert(f"gpu-{i}") for i in range(1, 11)]
    r = client.post("/webhook", json=payload(*storm), headers=AUTH)
    assert len(r.json()["created"]) == 10
    wait_for(_closed(rt, 3), 90, "the budgeted incidents to finish")
    time.sleep(0.5)
    fenced = [line for line in effect_lines(effects) if line.startswith("fenced")]
    assert len(fenced) == 3
    assert len(rt.journal.incidents(["held"])) == 7
    assert len(rt.journal.runs()) == 1  # the admitted nodes went in one batch
    assert breaker_state(rt.journal).open
    assert "autoheal_circuit_breaker_open 1.0" in client.get("/metrics").text
    [page] = [n for n in rt.notifier.sent if n["event"] == "breaker.tripped"]
    assert page["held"] == 7
    # the breaker latches: new alerts are held too
    client.post("/webhook", json=payload(alert("gpu-15")), headers=AUTH)
    wait_for(lambda: len(rt.journal.incidents(["held"])) == 8, 10, "new alert held")
    assert len([x for x in effect_lines(effects) if x.startswith("fenced")]) == 3
    # a human resets it: held incidents are decided again (and the storm trips it again)
    reset_breaker(rt.journal, "test")
    wait_for(_closed(rt, 6), 90, "three more to finish")
    assert breaker_state(rt.journal).open
    assert len([x for x in effect_lines(effects) if x.startswith("fenced")]) == 6


def test_storm_within_budget_is_batched_into_one_run(serve, effects):
    rt, client = serve(budgets={"max_nodes": 20, "max_pool_percent": 100}, batch_window_seconds=0.3)
    client.post("/webhook", json=payload(*[alert(f"gpu-{i}") for i in range(1, 9)]), headers=AUTH)
    wait_for(_closed(rt, 8), 90, "storm to finish")
    [run] = rt.journal.runs()
    assert len(run.nodes) == 8 and run.status == "successful"
    assert not breaker_state(rt.journal).open


@pytest.mark.parametrize("fences", [1, 0])
def test_busy_run_slots_do_not_leave_admitted_nodes_unfenced(serve, effects, tmp_path, monkeypatch, fences):
    """Fence first: with the only run slot busy, later incidents are fenced by a fence-only run at
    once, stay admitted, and their full run later does not fence again. Off (0): they wait."""
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_PHASE", "jobs_signalled")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP", "8")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_ONCE", str(tmp_path / "slept"))
    rt, client = serve(
        budgets={"max_nodes": 20, "max_pool_percent": 100},
        max_concurrent_runs=1,
        max_concurrent_fences=fences,
        batch_window_seconds=0.1,
    )
    client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH)
    wait_for(lambda: "jobs_signalled gpu-1" in effect_lines(effects), 60, "the first run to be busy")
    created = client.post("/webhook", json=payload(alert("gpu-2"), alert("gpu-3")), headers=AUTH)
    later = created.json()["created"]
    if fences:
        wait_for(lambda: {"fenced gpu-2", "fenced gpu-3"} <= set(effect_lines(effects)), 30, "the fence lane")
        assert (tmp_path / "slept").exists() and not _closed(rt, 1)()  # the first run is still busy
        assert {rt.journal.incident(i).state for i in later} == {"admitted"}
        [lane] = [r for r in rt.journal.runs() if r.source == "fence"]
        assert sorted(lane.nodes) == ["gpu-2", "gpu-3"]
        assert _extravars(rt, lane.id)["autoheal_stop_after"] == "fenced"
    else:
        time.sleep(2)
        assert not [x for x in effect_lines(effects) if x in ("fenced gpu-2", "fenced gpu-3")]
    wait_for(_closed(rt, 3), 90, "all three to finish")
    assert {rt.journal.incident(i).state for i in later} == {"completed"}
    lines = effect_lines(effects)
    assert lines.count("fenced gpu-2") == 1 and lines.count("drained gpu-2") == 1
    full = [r for r in rt.journal.runs() if r.source == "worker"]
    assert len(full) == 2 and all(r.status == "successful" for r in full)


def test_storm_beyond_the_run_slots_is_fenced_first_in_one_run_then_remediated(serve, effects, monkeypatch):
    monkeypatch.setenv(
        "AUTOHEAL_STUB_IGNORE_DONE", "1"
    )  # full runs re-check the fence, as the real play does
    rt, client = serve(
        budgets={"max_nodes": 20, "max_pool_percent": 100},
        max_concurrent_runs=1,
        max_batch=2,
        batch_window_seconds=0.3,
    )
    client.post("/webhook", json=payload(*[alert(f"gpu-{i}") for i in range(1, 6)]), headers=AUTH)
    wait_for(_closed(rt, 5), 120, "the storm to finish")
    runs = sorted(rt.journal.runs(), key=lambda r: r.id)
    assert runs[0].source == "fence" and len(runs[0].nodes) == 5  # every node fenced at once
    assert [len(r.nodes) for r in runs[1:]] == [2, 2, 1] and {r.source for r in runs[1:]} == {"worker"}
    lines = effect_lines(effects)
    assert 'autoheal_incident_phase_duration_seconds_count{phase="fenced"} 5.0' in client.get("/metrics").text
    assert sorted(x for x in lines if x.startswith("fenced")) == sorted(
        [f"fenced gpu-{i}" for i in range(1, 6)] * 2
    )
    assert sorted(lines[:5]) == [f"fenced gpu-{i}" for i in range(1, 6)]  # before any other step
    assert {i.state for i in rt.journal.incidents()} == {"completed"}


def test_uncordoning_a_fenced_node_by_hand_cancels_its_incident(serve, effects, kube, monkeypatch):
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_PHASE", "jobs_signalled")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP", "30")
    rt, client = serve(uncordon_check_seconds=0.2)
    kube.nodes["gpu-3"]["autoheal.io/state"] = "quarantined"
    kube.schedulable.add("gpu-3")  # not fenced by us yet: nothing happens
    [iid] = client.post("/webhook", json=payload(alert("gpu-4")), headers=AUTH).json()["created"]
    wait_for(lambda: "jobs_signalled gpu-4" in effect_lines(effects), 60, "the run to be past its fence")
    time.sleep(0.5)
    assert rt.journal.incident(iid).state == "running"
    kube.nodes["gpu-4"]["autoheal.io/state"] = "quarantined"
    kube.schedulable.add("gpu-4")  # kubectl uncordon gpu-4
    wait_for(lambda: rt.journal.incident(iid).state == "cancelled", 30, "the incident to be cancelled")
    [entry] = [t for t in rt.journal.timeline(iid) if t.phase == "cancel_requested"]
    assert entry.detail == "node uncordoned by hand"
    assert "drained gpu-4" not in effect_lines(effects)  # the run stopped before its later steps
    [run] = rt.journal.runs_of(iid)
    assert run.status == "cancelled"


def test_opt_out_label_skips_replacement_but_still_fences(serve, effects, kube):
    kube.nodes["gpu-2"]["autoheal.io/opt-out"] = "true"
    rt, client = serve()
    [iid] = client.post("/webhook", json=payload(alert("gpu-2")), headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 90, "incident to close")
    inc = rt.journal.incident(iid)
    assert inc.state == "completed" and inc.opt_out
    assert effect_lines(effects) == ["fenced gpu-2"]
    [run] = rt.journal.runs_of(iid)
    assert _extravars(rt, run.id)["autoheal_opt_out"] is True


def test_rule_dry_run_runs_in_check_mode(serve, effects):
    rt, client = serve()
    body = payload(alert("gpu-3", alertname="GpuXidRehearsal"))
    [iid] = client.post("/webhook", json=body, headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 90, "incident to close")
    inc = rt.journal.incident(iid)
    assert inc.state == "completed" and inc.dry_run and "dry run" in inc.reason
    [run] = rt.journal.runs_of(iid)
    assert run.check_mode
    assert (
        "--check"
        in (__import__("pathlib").Path(run.private_dir) / "artifacts" / "play" / "command").read_text()
    )
    assert all(line.startswith("dry ") for line in effect_lines(effects))


def test_failed_phase_fails_the_incident_and_escalates(serve, effects, monkeypatch):
    monkeypatch.setenv("AUTOHEAL_STUB_FAIL_PHASE", "drained")
    rt, client = serve()
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 90, "incident to close")
    inc = rt.journal.incident(iid)
    assert inc.state == "failed" and "drained" in inc.reason
    assert "escalated" in [t.phase for t in rt.journal.timeline(iid)]
    assert any(n["event"] == "incident.failed" for n in rt.notifier.sent)


def test_cancel_stops_a_running_play(serve, effects, monkeypatch):
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_PHASE", "jobs_signalled")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP", "60")
    rt, client = serve()
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(lambda: "jobs_signalled gpu-1" in effect_lines(effects), 60, "play to sleep")
    t0 = time.time()
    request_cancel(rt.journal, iid)
    wait_for(_closed(rt, 1), 30, "cancel")
    assert time.time() - t0 < 15
    assert rt.journal.incident(iid).state == "cancelled"
    assert rt.journal.runs_of(iid)[0].status == "cancelled"
    assert "requeued gpu-1" not in effect_lines(effects)


def test_step_timeout_fails_the_incident(serve, effects, monkeypatch):
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_PHASE", "fenced")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP", "60")
    rt, client = serve(step_timeout_seconds=3)
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 60, "timeout")
    inc = rt.journal.incident(iid)
    assert inc.state == "failed" and "longer than 3s" in inc.reason


def test_pause_keeps_incidents_queued_until_resume(serve, effects):
    rt, client = serve()
    set_paused(rt.journal, True, "maintenance")
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    time.sleep(1.0)
    assert rt.journal.incident(iid).state == "pending" and effect_lines(effects) == []
    set_paused(rt.journal, False)
    wait_for(_closed(rt, 1), 90, "incident after resume")
    assert rt.journal.incident(iid).state == "completed"


def test_a_locked_node_waits_for_its_lock(serve, effects):
    rt, client = serve()
    lock_dir = rt.worker.executor.locks.dir
    with (lock_dir / "gpu-1.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
        time.sleep(1.5)
        assert rt.journal.incident(iid).state in ("admitted", "running")
        assert effect_lines(effects) == []
    wait_for(_closed(rt, 1), 90, "incident after unlock")
    assert effect_lines(effects).count("fenced gpu-1") == 1


def test_run_by_hand_is_recorded_in_the_journal(runtime_factory, effects):
    rt = runtime_factory(with_worker=False)
    inc = run_by_hand(rt.config, rt.journal, "notify_only.yml", "gpu-9", check=True)
    assert inc.state == "completed" and inc.source == "manual" and inc.dry_run
    [run] = rt.journal.runs_of(inc.id)
    assert run.source == "manual" and run.check_mode
    assert effect_lines(effects) == ["dry notified gpu-9"]


def test_run_by_hand_refuses_bad_node_and_playbook(runtime_factory):
    from remediation.errors import ExecutionError, RemediationError

    rt = runtime_factory(with_worker=False)
    with pytest.raises(RemediationError):
        run_by_hand(rt.config, rt.journal, "notify_only.yml", "$(id)", check=True)
    with pytest.raises(ExecutionError):
        run_by_hand(rt.config, rt.journal, "../../etc/passwd", "gpu-1", check=True)


def test_hostile_payloads_run_no_play(serve, effects):
    rt, client = serve()
    for node in ("{{ lookup('pipe','id') }}", "$(reboot)", "../../x", "a" * 300):
        r = client.post("/webhook", json=payload(alert(node)), headers=AUTH)
        assert r.status_code == 422
    time.sleep(1.0)
    assert rt.journal.runs() == [] and rt.journal.incidents() == []
    assert effect_lines(effects) == []


def test_a_second_runner_on_the_same_state_dir_refuses_to_start(runtime_factory):
    from remediation.errors import RemediationError
    from remediation.worker import Worker

    rt = runtime_factory()
    rt.worker.start()
    w = rt.worker
    second = Worker(rt.config, rt.journal, w.policy, w.executor, w.metrics, w.notifier)
    with pytest.raises(RemediationError, match="another runner"):
        second.start()


def test_an_unexpected_runner_error_fails_the_incident_instead_of_hanging(serve, monkeypatch):
    rt, client = serve()

    def explode(*args, **kwargs):
        raise RuntimeError("ansible-runner blew up")

    monkeypatch.setattr(rt.worker.executor, "run", explode)
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 30, "the incident to fail")
    inc = rt.journal.incident(iid)
    assert inc.state == "failed" and "blew up" in inc.reason
    assert any(n["event"] == "incident.failed" for n in rt.notifier.sent)


class FakeWarmFence:
    """Stands in for remediation.warmfence.WarmFence: records the extra vars it got and reports
    `fenced` in the run's events file, as the real one does."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[dict] = []

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def fence(self, extravars):
        from pathlib import Path

        from remediation.warmfence import WarmFenceResult

        self.calls.append(extravars)
        if not self.ok:
            return WarmFenceResult(False, 0.01, error="boom")
        lines = [
            json.dumps({"incident": i, "node": n, "phase": "fenced", "status": "ok", "ts": time.time()})
            for n, i in zip(extravars["autoheal_nodes"], extravars["autoheal_incident_ids"], strict=True)
        ]
        with Path(extravars["autoheal_journal_events"]).open("a") as fh:
            fh.write("\n".join(lines) + "\n")
        return WarmFenceResult(True, 0.01, changed=True)


@pytest.mark.parametrize("ok", [True, False])
def test_the_warm_fence_runs_beside_the_play_and_never_in_check_mode(runtime_factory, effects, ok):
    """A full run fences on the warm path too (the play's fence finds it done); a failed warm
    fence costs nothing but time (the play fences); a dry run never takes the warm path."""
    rt = runtime_factory()
    warm = FakeWarmFence(ok)
    rt.worker.warm_fence = warm
    with TestClient(create_app(rt)) as client:
        [iid] = client.post("/webhook", json=payload(alert("gpu-1", xid=79, gpu=3)), headers=AUTH).json()[
            "created"
        ]
        wait_for(_closed(rt, 1), 90, "incident to close")
        assert rt.journal.incident(iid).state == "completed"
        [call] = warm.calls
        assert call["autoheal_nodes"] == ["gpu-1"] and call["autoheal_incident_ids"] == [iid]
        assert call["autoheal_dry_run"] is False
        text = client.get("/metrics").text
        assert f'autoheal_warm_fence_seconds_count{{outcome="{"ok" if ok else "failed"}"}} 1.0' in text
        assert "fenced" in rt.journal.done_phases(iid)

        body = payload(alert("gpu-3", alertname="GpuXidRehearsal"))
        [dry] = client.post("/webhook", json=body, headers=AUTH).json()["created"]
        wait_for(_closed(rt, 2), 90, "the dry run to close")
        assert rt.journal.incident(dry).dry_run and len(warm.calls) == 1


@pytest.mark.parametrize(
    ("failed", "outcome"),
    [
        ("gpu_reset,validated", "completed"),  # the reset did not do; the reboot brought it back
        ("gpu_reset,rebooted", "failed"),  # the reboot after the climb failed too
    ],
)
def test_a_failure_the_ladder_climbed_past_is_not_the_outcome(serve, effects, monkeypatch, failed, outcome):
    monkeypatch.setenv(
        "AUTOHEAL_STUB_PHASES", "fenced,jobs_signalled,gpu_reset,validated,climbed,rebooted,returned"
    )
    monkeypatch.setenv("AUTOHEAL_STUB_REPORT_FAILED", failed)
    rt, client = serve()
    [iid] = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(_closed(rt, 1), 90, "incident to close")
    inc = rt.journal.incident(iid)
    assert inc.state == outcome, inc.reason
    if outcome == "failed":
        assert "rebooted" in inc.reason and "gpu_reset" not in inc.reason
