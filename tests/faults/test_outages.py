"""Dependency outages (issue 17, Deliver 3) the runner itself meets: its journal's disk full, the
notification sink down, Alertmanager killed and back. The runner answers what it could not record
with a 5xx (Alertmanager retries), never crashes, backs off instead of spinning, carries on when the
dependency is back, and runs nothing twice when a restarted Alertmanager delivers again.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from autoheal.backoff import Backoff
from remediation.journal import Journal
from remediation.states import IncidentState
from tests.faults.faulthelp import RUNBOOK_PHASES, RunnerProcess, Sink
from tests.remediation.remhelp import (
    AM_BIN,
    AUTH,
    Alertmanager,
    alert,
    effect_lines,
    free_port,
    payload,
    write_config,
)
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)


def test_backoff_grows_to_its_cap_and_resets_after_a_success():
    b = Backoff(base=0.5, cap=8.0)
    delays = [b.failed() for _ in range(8)]
    for n, d in enumerate(delays):
        want = min(8.0, 0.5 * 2**n)
        assert want / 2 <= d <= want
    assert max(delays[5:]) <= 8.0 and min(delays[5:]) >= 4.0
    b.succeeded()
    assert b.failed() <= 0.5


def _metric(url: str, name: str, labels: str = "") -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a disk we can fill (needs root, as the lab does)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


def _wait_closed(journal: Journal, iid: str) -> None:
    wait_for(lambda: not journal.require_incident(iid).is_open, 90, f"incident {iid} to close")


def test_journal_disk_full_is_a_5xx_the_worker_backs_off_and_both_resume(tmp_path, small_disk):
    port = free_port()
    cfg = write_config(
        tmp_path, listen_port=port, journal_path=str(small_disk / "journal.sqlite"), batch_window_seconds=1.5
    )
    env = {"AUTOHEAL_STUB_PHASES": RUNBOOK_PHASES, "AUTOHEAL_STUB_EFFECTS": str(tmp_path / "effects.log")}
    runner = RunnerProcess(tmp_path, cfg, port, env)
    try:
        runner.start()
        first = httpx.post(f"{runner.url}/webhook", json=payload(alert("gpu-1")), headers=AUTH, timeout=10)
        assert first.status_code == 200
        [iid] = first.json()["created"]
        filler = _fill(small_disk)  # within the batch window: the worker's decision cannot be written
        second = payload(alert("gpu-2"))
        r = httpx.post(f"{runner.url}/webhook", json=second, headers=AUTH, timeout=10)
        assert r.status_code == 500 and "nothing recorded" in r.text  # Alertmanager will retry
        wait_for(lambda: _metric(runner.url, "autoheal_worker_errors_total") >= 3, 60, "the worker to fail")
        assert runner.procs[-1].poll() is None
        assert httpx.get(f"{runner.url}/healthz", timeout=5).status_code == 200
        pauses = [float(x) for x in re.findall(r"next try in ([0-9.]+)s", runner.log())]
        assert len(pauses) >= 3 and pauses[2] > pauses[0]  # growing, not a fixed interval
        assert runner.log().count(", in _loop") == 1  # one traceback per outage, not one per tick
        journal = Journal(small_disk / "journal.sqlite")
        assert journal.require_incident(iid).state is IncidentState.PENDING  # nothing half-written

        os.unlink(filler)  # the disk has room again
        r = httpx.post(f"{runner.url}/webhook", json=second, headers=AUTH, timeout=10)  # the retry
        assert r.status_code == 200
        [iid2] = r.json()["created"]
        for i in (iid, iid2):
            _wait_closed(journal, i)
            assert journal.require_incident(i).state is IncidentState.COMPLETED
        journal.close()
    finally:
        runner.stop_all()


def test_sink_down_never_blocks_a_run_and_pages_again_once_back(tmp_path):
    sink = Sink(free_port())  # not started: down
    port = free_port()
    cfg = write_config(tmp_path, listen_port=port, notify=[{"url": sink.url, "retries": 1}])
    runner = RunnerProcess(tmp_path, cfg, port, {"AUTOHEAL_STUB_PHASES": RUNBOOK_PHASES})
    journal = None
    try:
        runner.start()
        r = httpx.post(f"{runner.url}/webhook", json=payload(alert("gpu-1")), headers=AUTH, timeout=10)
        [iid] = r.json()["created"]
        journal = Journal(tmp_path / "journal.sqlite")
        wait_for(lambda: not journal.require_incident(iid).is_open, 90, "the incident to close")
        assert journal.require_incident(iid).state is IncidentState.COMPLETED
        failed = 'autoheal_notifications_total{outcome="failed",sink="webhook"}'
        wait_for(lambda: _metric(runner.url, failed) >= 1, 30, "the failed notification to be counted")
        sink.start()
        r = httpx.post(f"{runner.url}/webhook", json=payload(alert("gpu-2")), headers=AUTH, timeout=10)
        [iid2] = r.json()["created"]
        wait_for(
            lambda: [e for e in sink.named("incident.completed") if e["incident"] == iid2], 90, "the page"
        )
    finally:
        runner.stop_all()
        sink.stop()
        if journal is not None:
            journal.close()


@pytest.mark.skipif(not os.path.exists(AM_BIN), reason="prometheus-alertmanager not installed")
def test_alertmanager_killed_and_back_the_runner_loses_nothing_and_runs_nothing_twice(tmp_path):
    """Alertmanager is killed (-9) while an incident's play runs; the sources' posts fail meanwhile
    (the watcher and Prometheus send again); back, it has forgotten what it sent and delivers the
    first alert again beside the new one. The play already under way never needed Alertmanager;
    the re-delivery joins its closed incident; the new fault gets its own incident; every step of
    each ran once."""
    port = free_port()
    effects = tmp_path / "effects.log"
    env = {
        "AUTOHEAL_STUB_PHASES": RUNBOOK_PHASES,
        "AUTOHEAL_STUB_EFFECTS": str(effects),
        "AUTOHEAL_STUB_SLEEP_PHASE": "spare_promoted",
        "AUTOHEAL_STUB_SLEEP": "3",
    }
    runner = RunnerProcess(tmp_path, write_config(tmp_path, listen_port=port), port, env)
    am = Alertmanager(tmp_path / "am", f"{runner.url}/webhook", tmp_path / "token")
    starts = (datetime.now(UTC) - timedelta(seconds=5)).isoformat()
    labels = {"alertname": "GpuXidFatal", "xid": "79", "gpu": "3", "severity": "critical"}
    journal = None
    try:
        runner.start()
        am.start()
        journal = Journal(tmp_path / "journal.sqlite")
        jr = journal
        am.post({**labels, "Hostname": "gpu-1"}, starts)
        [first] = wait_for(lambda: jr.incidents(), 30, "the first incident")
        wait_for(lambda: "jobs_signalled gpu-1" in effect_lines(effects), 60, "the play to be under way")
        am.kill()
        with pytest.raises(httpx.ConnectError):  # what the source sees; it sends again later
            am.post({**labels, "Hostname": "gpu-2"}, starts)
        _wait_closed(journal, first.id)  # the run never needed Alertmanager
        assert journal.require_incident(first.id).state is IncidentState.COMPLETED

        am.start()
        am.post({**labels, "Hostname": "gpu-1"}, starts)  # still firing: the source re-sends it
        am.post({**labels, "Hostname": "gpu-2"}, starts)
        wait_for(lambda: len(jr.incidents()) == 2, 30, "the second incident")
        [second] = [i for i in journal.incidents() if i.id != first.id]
        _wait_closed(journal, second.id)
        assert journal.require_incident(second.id).state is IncidentState.COMPLETED
        wait_for(lambda: len(jr.alerts(first.id)) >= 2, 30, "the first alert's re-delivery")
        metrics = httpx.get(f"{runner.url}/metrics", timeout=5).text
    finally:
        am.stop()
        runner.stop_all()

    assert second.node == "gpu-2"
    # the re-delivery joined the closed incident: no second run for gpu-1
    assert [a["outcome"] for a in journal.alerts(first.id)][1:] == ["joined"] * (
        len(journal.alerts(first.id)) - 1
    )
    counts = Counter(effect_lines(effects))
    for node in ("gpu-1", "gpu-2"):
        assert [counts[f"{ph} {node}"] for ph in RUNBOOK_PHASES.split(",")] == [1] * 7, counts
    codes = dict(re.findall(r'^autoheal_webhook_requests_total\{code="(\d+)"\} ([0-9.]+)$', metrics, re.M))
    assert set(codes) == {"200"} and float(codes["200"]) >= 3, codes  # Alertmanager never saw an error
    journal.close()
