"""The real Alertmanager (Debian's 0.25 binary) posts to the runner with a bearer token from a
credentials file; duplicates and the resolution of one fault make one incident."""

from __future__ import annotations

import shutil
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import uvicorn

from remediation.app import create_app
from tests.remediation.remhelp import AM_BIN, Alertmanager, free_port
from tests.support import wait_for

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not shutil.which(AM_BIN), reason="prometheus-alertmanager not installed"),
]


@pytest.fixture
def runner(runtime_factory):
    """The runner's app (no worker: this test is about delivery) on a free loopback port."""
    rt = runtime_factory(with_worker=False)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(rt), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 20, "runner to start")
    yield rt, port
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def alertmanager(tmp_path, runner):
    rt, runner_port = runner
    am = Alertmanager(tmp_path / "am", f"http://127.0.0.1:{runner_port}/webhook", rt.config.token_file)
    try:
        am.start()
        yield am
    finally:
        am.stop()


def _post(am: Alertmanager, labels: dict[str, str], starts: datetime, ends: datetime | None = None) -> None:
    am.post(labels, starts.isoformat(), None if ends is None else ends.isoformat())


def test_real_alertmanager_delivers_duplicates_as_one_incident(runner, alertmanager):
    rt, _ = runner
    labels = {
        "alertname": "GpuXidFatal",
        "Hostname": "gpu-5",
        "xid": "79",
        "gpu": "2",
        "severity": "critical",
    }
    starts = datetime.now(UTC) - timedelta(seconds=5)
    for _ in range(3):
        _post(alertmanager, labels, starts)
    wait_for(lambda: rt.journal.alerts(), 20, "the first webhook delivery")
    # another GPU of the same node fails: same node and fault class -> same incident
    _post(alertmanager, {**labels, "gpu": "6"}, starts)
    wait_for(lambda: len(rt.journal.alerts()) >= 3, 20, "the group update")
    # the first alert resolves
    _post(alertmanager, labels, starts, ends=datetime.now(UTC) - timedelta(seconds=1))
    wait_for(
        lambda: any(a["status"] == "resolved" for a in rt.journal.alerts()), 20, "the resolved notification"
    )
    time.sleep(1.5)
    [inc] = rt.journal.incidents()
    assert (inc.node, inc.xid, inc.tier) == ("gpu-5", 79, "reboot")
    assert inc.resolved_alerts >= 1 and inc.alert_count >= 3
    assert {a["incident_id"] for a in rt.journal.alerts()} == {inc.id}
    assert 'code="401"' not in rt.metrics.exposition().decode()
