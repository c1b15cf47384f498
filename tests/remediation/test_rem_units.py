"""Small units: auth, play inputs, the play's events file, node locks, notifications."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest

from autoheal import __version__
from remediation.auth import check_bearer, load_token
from remediation.config import NotifySink
from remediation.errors import AuthError, ExecutionError, NodeBusyError, RunnerConfigError
from remediation.executor import NodeLocks, PlayVars, read_events
from remediation.metrics import Metrics
from remediation.notify import Notifier


def test_check_bearer_accepts_only_the_exact_token():
    check_bearer("Bearer abcdefghijklmnop", b"abcdefghijklmnop")
    check_bearer("bearer abcdefghijklmnop", b"abcdefghijklmnop")
    for header in (
        None,
        "",
        "abcdefghijklmnop",
        "Bearer abcdefghijklmno",
        "Token abcdefghijklmnop",
        "Bearer ÿ",
    ):
        with pytest.raises(AuthError):
            check_bearer(header, b"abcdefghijklmnop")


def test_short_or_missing_token_file_is_refused(tmp_path):
    with pytest.raises(RunnerConfigError, match="cannot read"):
        load_token(tmp_path / "nope")
    (tmp_path / "t").write_text("short\n")
    with pytest.raises(RunnerConfigError, match="at least"):
        load_token(tmp_path / "t")


def _vars(**kw):
    base = {
        "nodes": ("gpu-1",),
        "incident_ids": ("inc-0123456789ab",),
        "xid": 79,
        "gpu": 3,
        "tier": "replace",
        "opt_out": False,
        "dry_run": False,
        "grace_seconds": 120,
        "journal_events": Path("/tmp/e.jsonl"),
    }
    return PlayVars(**{**base, **kw})


def test_play_vars_render_the_contract():
    ev = _vars(done_phases={"gpu-1": ["fenced", "BAD;"], "other": ["x"]}).extravars()
    assert ev == {
        "autoheal_nodes": ["gpu-1"],
        "autoheal_incident_ids": ["inc-0123456789ab"],
        "autoheal_xid": 79,
        "autoheal_gpu": 3,
        "autoheal_tier": "replace",
        "autoheal_opt_out": False,
        "autoheal_dry_run": False,
        "autoheal_grace_seconds": 120,
        "autoheal_journal_events": "/tmp/e.jsonl",
        "autoheal_signal_ledger": "/tmp/signalled.json",  # beside the events: one per run
        "autoheal_done_phases": {"gpu-1": ["fenced"]},
        "autoheal_stop_after": "",
        "autoheal_fault_time": 0.0,
        "autoheal_version": __version__,
    }
    assert _vars(stop_after="fenced").extravars()["autoheal_stop_after"] == "fenced"


@pytest.mark.parametrize(
    "kw",
    [
        {"nodes": ("{{ x }}",)},
        {"nodes": ("gpu-1", "gpu-1"), "incident_ids": ("inc-0123456789ab",) * 2},
        {"incident_ids": ("inc-$(id)",)},
        {"tier": "notify"},
        {"xid": 5000},
        {"gpu": 99},
        {"nodes": ()},
        {"nodes": ("a", "b")},
        {"stop_after": "drained; rm -rf /"},
    ],
)
def test_play_vars_refuse_bad_inputs(kw):
    with pytest.raises(ExecutionError):
        _vars(**kw).extravars()


def test_events_file_lines_are_validated_against_the_run(tmp_path):
    path = tmp_path / "ev.jsonl"
    good = {"incident": "inc-1", "node": "gpu-1", "phase": "fenced", "status": "ok", "ts": 5.0}
    lines = [
        json.dumps(good),
        json.dumps({**good, "node": "gpu-2"}),  # node not of that incident
        json.dumps({**good, "incident": "inc-9"}),  # incident not in the run
        json.dumps({**good, "phase": "{{ x }}"}),
        json.dumps({**good, "status": "done"}),
        "not json",
        "[1]",
        json.dumps({**good, "phase": "drained", "status": "start", "detail": "x" * 900}),
    ]
    path.write_text("\n".join(lines) + "\n" + '{"partial": ')
    events, offset = read_events(path, 0, {"inc-1": "gpu-1"})
    assert [(e.phase, e.status) for e in events] == [("fenced", "ok"), ("drained", "start")]
    assert events[1].detail == "x" * 500
    assert offset == len(path.read_bytes()) - len('{"partial": ')
    assert read_events(path, offset, {"inc-1": "gpu-1"}) == ([], offset)


def test_node_lock_is_exclusive_and_released(tmp_path):
    locks = NodeLocks(tmp_path)
    with locks.hold(["gpu-1", "gpu-2"]):
        assert locks.busy("gpu-1")
        with pytest.raises(NodeBusyError), NodeLocks(tmp_path).hold(["gpu-3", "gpu-2"]):
            pass
        assert not locks.busy("gpu-3")  # the partial acquisition was released
    assert not locks.busy("gpu-1")


class _Sink(BaseHTTPRequestHandler):
    received: list[dict] = []
    fail_first = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if _Sink.fail_first > 0:
            _Sink.fail_first -= 1
            self.send_response(503)
        else:
            _Sink.received.append(body)
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def sink():
    _Sink.received, _Sink.fail_first = [], 0
    server = HTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


def test_notifications_are_retried_and_sent_as_json_and_slack(sink):
    _Sink.fail_first = 1
    metrics = Metrics()
    n = Notifier(
        (NotifySink(kind="webhook", url=sink), NotifySink(kind="slack", url=sink)), metrics, backoff=0.01
    )
    n.start()
    n.send("incident.failed", incident="inc-1", node="gpu-1", reason="drain timed out")
    deadline = time.time() + 10
    while len(_Sink.received) < 2 and time.time() < deadline:
        time.sleep(0.02)
    n.stop()
    generic, slack = _Sink.received
    assert generic["event"] == "incident.failed" and generic["node"] == "gpu-1"
    assert "inc-1" in slack["text"] and "gpu-1" in slack["text"]
    assert b'autoheal_notifications_total{outcome="sent",sink="slack"} 1.0' in metrics.exposition()


def test_a_failed_notification_is_not_waited_for_after_its_last_try(sink):
    """503 every time, 2 retries: waits of 0.2 and 0.4 s between the three tries, none after the
    last (it used to sleep 0.8 s more before giving up)."""
    _Sink.fail_first = 99
    metrics = Metrics()
    n = Notifier((NotifySink(url=sink, retries=2),), metrics, backoff=0.2)
    with httpx.Client() as client:
        t0 = time.monotonic()
        n._deliver(client, n.sinks[0], {"event": "x"})
        took = time.monotonic() - t0
    assert 99 - _Sink.fail_first == 3, "three tries"
    assert 0.6 <= took < 1.2, took
    assert b'autoheal_notifications_total{outcome="failed",sink="webhook"} 1.0' in metrics.exposition()


def test_stop_ends_a_notification_waiting_to_retry(sink):
    _Sink.fail_first = 99
    metrics = Metrics()
    n = Notifier((NotifySink(url=sink, retries=5),), metrics, backoff=30)
    n.start()
    thread = n._thread
    assert thread is not None
    n.send("incident.failed", incident="inc-1")
    deadline = time.time() + 10
    while _Sink.fail_first == 99 and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # the first try failed: it waits 30 s for the second now
    t0 = time.monotonic()
    n.stop(timeout=5)
    assert not thread.is_alive() and time.monotonic() - t0 < 2
    assert _Sink.fail_first == 98, "stopped: not tried again"
    assert b'autoheal_notifications_total{outcome="failed",sink="webhook"} 1.0' in metrics.exposition()


def test_sending_never_blocks_when_the_sink_is_down():
    n = Notifier(
        (NotifySink(url="http://127.0.0.1:9/down", retries=3, timeout_seconds=1),),  # type: ignore[arg-type]
        Metrics(),
        maxsize=5,
        backoff=0.5,
    )
    n.start()
    t0 = time.perf_counter()
    for i in range(50):
        n.send("x", incident=str(i))
    assert time.perf_counter() - t0 < 0.5
    n.stop(timeout=0.1)


def test_group_commit_rolls_back_a_failing_delivery_alone(journal_target):
    from concurrent.futures import Future

    from remediation.committer import GroupCommitter
    from remediation.errors import JournalError

    journal = journal_target.open()

    class Intake:
        def apply(self, tx, routed):
            tx.add_alert(
                fingerprint="a",
                starts_at=0.0,
                status="firing",
                alertname=routed,
                labels={},
                outcome="unrouted",
            )
            if routed == "bad":
                raise RuntimeError("boom")
            return routed

    committer = GroupCommitter(journal, Intake())  # type: ignore[arg-type]
    group: list = [("one", Future()), ("bad", Future()), ("two", Future())]
    committer._commit(group)
    assert group[0][1].result() == "one" and group[2][1].result() == "two"
    with pytest.raises(JournalError):
        group[1][1].result()
    assert [a["alertname"] for a in journal.alerts()] == ["one", "two"]
    journal.close()
