"""`kill -9` of a real runner process in the middle of a play, then a restart: the incident
completes exactly once and no phase that had finished is run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from remediation.executor import find_plays, pid_is_play, stop_play
from remediation.journal import Journal
from tests.remediation.remhelp import AUTH, alert, effect_lines, free_port, payload, stop_pid, write_config
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]


def test_kill_9_during_a_run_then_restart_completes_once_without_repeating_steps(tmp_path):
    port = free_port()
    cfg = write_config(tmp_path, listen_port=port)
    effects = tmp_path / "effects.log"
    env = dict(
        os.environ,
        AUTOHEAL_STUB_EFFECTS=str(effects),
        AUTOHEAL_STUB_SLEEP_PHASE="jobs_signalled",
        AUTOHEAL_STUB_SLEEP="20",
        AUTOHEAL_STUB_SLEEP_ONCE=str(tmp_path / "slept"),
        PYTHONPATH=str(REPO),
    )
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / f"serve-{len(procs)}.log").open("wb")
        p = subprocess.Popen(
            [sys.executable, "-m", "remediation", "serve", "--config", str(cfg)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(p)

        def ready() -> bool:
            assert p.poll() is None, (tmp_path / f"serve-{len(procs) - 1}.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "runner to be ready")
        return p

    journal = None
    try:
        first = start()
        r = httpx.post(
            f"http://127.0.0.1:{port}/webhook", json=payload(alert("gpu-1")), headers=AUTH, timeout=10
        )
        [iid] = r.json()["created"]
        wait_for(
            lambda: "jobs_signalled gpu-1" in effect_lines(effects),
            60,
            "the play to be inside jobs_signalled",
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        journal = Journal(tmp_path / "journal.sqlite")
        [run1] = journal.runs()
        assert run1.status == "running" and run1.play_pid and pid_is_play(run1.play_pid)
        assert run1.play_pid in find_plays(run1.private_dir)

        start()
        wait_for(
            lambda: journal.incident(iid).state not in ("pending", "admitted", "running"),
            90,
            "the incident to finish after restart",
        )
        inc = journal.incident(iid)
        assert inc.state == "completed", inc.reason
        assert not pid_is_play(run1.play_pid)  # the orphaned play was stopped
        lines = effect_lines(effects)
        assert lines.count("fenced gpu-1") == 1  # finished before the crash: not repeated
        assert lines.count("jobs_signalled gpu-1") == 2  # unfinished at the crash: redone
        for phase in ("requeued", "drained", "replacement_ready"):
            assert lines.count(f"{phase} gpu-1") == 1
        runs = journal.runs_of(iid)
        assert [r.status for r in runs] == ["interrupted", "successful"]
        extravars = json.loads((Path(runs[1].private_dir) / "env" / "extravars").read_text())
        assert extravars["autoheal_done_phases"] == {"gpu-1": ["fenced"]}
        timeline = journal.timeline(iid)
        assert [t.phase for t in timeline].count("resolved") == 1
        assert "resumed" in [t.phase for t in timeline]
        oks = [t.phase for t in timeline if t.status == "ok" and t.source == "play"]
        assert len(oks) == len(set(oks))
    finally:
        for p in procs:
            stop_pid(p)
        if journal is not None:
            for run in journal.runs():
                if run.play_pid:
                    stop_play(run.play_pid)
            journal.close()
