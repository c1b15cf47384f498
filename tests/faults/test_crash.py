"""Crash anywhere (issue 17, Deliver 2): `kill -9` of a real runner process at every journal
boundary of one incident's life and in the middle of each runbook step, then a restart.

After the restart the incident completes exactly once; a step that had finished before the crash
is never run again (so no spare is promoted twice, no job requeued twice); the step in flight is
redone once (the runbook's steps are idempotent: tests/runbook); the journal shows the crash (the
run `interrupted`) and the resumption (`resumed`). Boundaries use the runner's test-only crash
points (remediation/crashpoints.py); mid-step kills happen while the stub play sleeps inside the
step, after its side effect and before its report.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest

from remediation.crashpoints import ENV as CRASH_ENV
from remediation.executor import pid_is_play, stop_play
from remediation.journal import Journal
from remediation.states import IncidentState, RunStatus
from tests.faults.faulthelp import RUNBOOK_PHASES, RunnerProcess, Sink
from tests.remediation.remhelp import AUTH, alert, effect_lines, free_port, payload, write_config
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)

ALL_BOUNDARIES = ["decided", "run_created", "phase:fenced", "phase:spare_promoted", "play_ended", "closed"]
# CI runs a subset (each case is two runner starts and two plays, ~30 s on a loaded 2-core
# machine); AUTOHEAL_CRASH_MATRIX=full (bench/crash.py) runs every boundary and every step.
FULL = os.environ.get("AUTOHEAL_CRASH_MATRIX") == "full"
BOUNDARIES = ALL_BOUNDARIES if FULL else ["run_created", "phase:spare_promoted", "closed"]
# the steps -> the runbook's phase names
STEPS = {
    "fence": "fenced",
    "signal": "jobs_signalled",
    "promote": "spare_promoted",
    "requeue": "requeued",
    "drain": "drained",
    "retire": "retired",
}


def _setup(tmp_path: Path) -> tuple[RunnerProcess, Sink, Path]:
    sink = Sink(free_port())
    sink.start()
    port = free_port()
    cfg = write_config(tmp_path, listen_port=port, notify=[{"url": sink.url, "retries": 0}])
    effects = tmp_path / "effects.log"
    env = {
        "AUTOHEAL_STUB_EFFECTS": str(effects),
        "AUTOHEAL_STUB_PHASES": RUNBOOK_PHASES,
        "AUTOHEAL_STUB_SLEEP_ONCE": str(tmp_path / "slept"),
    }
    return RunnerProcess(tmp_path, cfg, port, env), sink, effects


def _fire(runner: RunnerProcess) -> str:
    r = httpx.post(f"{runner.url}/webhook", json=payload(alert("gpu-1")), headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    [iid] = r.json()["created"]
    return str(iid)


def _check_after_restart(
    runner: RunnerProcess, sink: Sink, effects: Path, iid: str, in_flight: str | None, pages: int = 1
) -> None:
    """`pages`: completion notifications expected (0 when the crash fell between the close and
    its notification: notifications are sent at most once, the journal has the close)."""
    journal = Journal(runner.config.parent / "journal.sqlite")
    try:
        wait_for(
            lambda: not journal.require_incident(iid).is_open, 90, "the incident to close after the restart"
        )
        inc = journal.require_incident(iid)
        assert inc.state is IncidentState.COMPLETED, inc.reason
        timeline = journal.timeline(iid)
        phases = [t.phase for t in timeline]
        assert phases.count("resolved") == 1  # completed exactly once
        assert phases.count("received") == 1
        runs = journal.runs_of(iid)
        assert runs[-1].status is RunStatus.SUCCESSFUL
        assert all(r.status is RunStatus.INTERRUPTED for r in runs[:-1])
        # every step ran, each once, except the one in flight at the crash: redone once
        counts = Counter(effect_lines(effects))
        for phase in RUNBOOK_PHASES.split(","):
            want = {1, 2} if phase == in_flight else {1}
            assert counts[f"{phase} gpu-1"] in want, (phase, counts)
        oks = [t.phase for t in timeline if t.status == "ok" and t.source == "play"]
        assert len(oks) == len(set(oks)) == len(RUNBOOK_PHASES.split(","))
        for run in runs:
            if run.play_pid:
                assert not pid_is_play(run.play_pid)  # the orphaned play was stopped
        if len(runs) > 1:
            assert "resumed" in phases  # the journal shows the crash and the resumption
        if pages:
            wait_for(lambda: sink.named("incident.completed"), 10, "the completion notification")
        assert len(sink.named("incident.completed")) == pages
    finally:
        for run in journal.runs():
            if run.play_pid:
                stop_play(run.play_pid)
        journal.close()


@pytest.mark.parametrize("point", BOUNDARIES)
def test_kill_9_at_a_journal_boundary_then_restart_completes_once(tmp_path, point):
    runner, sink, effects = _setup(tmp_path)
    try:
        first = runner.start({CRASH_ENV: point})
        iid = _fire(runner)
        assert first.wait(60) == -signal.SIGKILL, runner.log(0)
        assert f"crash point {point} reached" in runner.log(0)
        runner.start()
        # the orphaned play may have finished more steps before the restart stopped it: the
        # step it was in is the only one that may run twice
        in_flight = None
        if point.startswith("phase:"):
            order = RUNBOOK_PHASES.split(",")
            in_flight = order[order.index(point.split(":", 1)[1]) + 1]
        pages = 0 if point == "closed" else 1
        _check_after_restart(runner, sink, effects, iid, in_flight=in_flight, pages=pages)
        if point == "closed":  # the close was committed: the restart has nothing to redo
            assert len(Journal(runner.config.parent / "journal.sqlite").runs_of(iid)) == 1
    finally:
        runner.stop_all()
        sink.stop()


@pytest.mark.parametrize("step", list(STEPS) if FULL else ["promote"])
def test_kill_9_in_the_middle_of_a_step_then_restart_redoes_only_that_step(tmp_path, step):
    phase = STEPS[step]
    runner, sink, effects = _setup(tmp_path)
    runner.env.update(AUTOHEAL_STUB_SLEEP_PHASE=phase, AUTOHEAL_STUB_SLEEP="30")
    try:
        first = runner.start()
        iid = _fire(runner)
        wait_for(lambda: f"{phase} gpu-1" in effect_lines(effects), 60, f"the play to be inside {phase}")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        runner.start()
        _check_after_restart(runner, sink, effects, iid, in_flight=phase)
        journal = Journal(tmp_path / "journal.sqlite")
        runs = journal.runs_of(iid)
        journal.close()
        extravars = json.loads((Path(runs[-1].private_dir) / "env" / "extravars").read_text())
        done = extravars["autoheal_done_phases"]["gpu-1"]
        order = RUNBOOK_PHASES.split(",")
        assert done == order[: order.index(phase)]  # the rerun skips exactly what had finished
        assert Counter(effect_lines(effects))[f"{phase} gpu-1"] == 2
    finally:
        runner.stop_all()
        sink.stop()
