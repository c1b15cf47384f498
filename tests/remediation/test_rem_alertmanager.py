"""The real Alertmanager (Debian's 0.25 binary) posts to the runner with a bearer token from a
credentials file; duplicates and the resolution of one fault make one incident."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import uvicorn
import yaml
from remhelp import free_port, stop_pid

from remediation.app import create_app
from tests.support import wait_for

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
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
    port = free_port()
    config = {
        "route": {
            "receiver": "autoheal",
            "group_by": ["Hostname", "alertname"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "autoheal",
                "webhook_configs": [
                    {
                        "url": f"http://127.0.0.1:{runner_port}/webhook",
                        "send_resolved": True,
                        "http_config": {
                            "authorization": {"type": "Bearer", "credentials_file": str(rt.config.token_file)}
                        },
                    }
                ],
            }
        ],
    }
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(yaml.safe_dump(config))
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            AM_BIN,
            f"--config.file={cfg}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "alertmanager to be ready")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_pid(proc)


def _post(am: str, labels: dict[str, str], starts: datetime, ends: datetime | None = None) -> None:
    body = [
        {
            "labels": labels,
            "annotations": {"summary": "XID"},
            "startsAt": starts.isoformat(),
            "generatorURL": "http://prometheus/graph",
        }
    ]
    if ends is not None:
        body[0]["endsAt"] = ends.isoformat()
    r = httpx.post(f"{am}/api/v2/alerts", json=body, timeout=5)
    assert r.status_code == 200, r.text


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
