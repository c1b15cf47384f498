"""The webhook: authentication, limits, validation, journaling and dedup (no plays run here)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from starlette.testclient import TestClient

from remediation.app import create_app
from remediation.errors import JournalError
from remediation.states import IncidentState
from tests.remediation.remhelp import AUTH, FIXTURE, TOKEN, alert, payload


@pytest.fixture
def rt(runtime_factory):
    return runtime_factory(with_worker=False)


@pytest.fixture
def client(rt):
    with TestClient(create_app(rt)) as c:
        yield c


def _counts(rt):
    return len(rt.journal.alerts()), len(rt.journal.incidents())


def test_real_alertmanager_fixture_is_accepted_and_journaled(rt, client):
    r = client.post("/webhook", content=FIXTURE.read_bytes(), headers=AUTH)
    assert r.status_code == 200
    [iid] = r.json()["created"]
    inc = rt.journal.incident(iid)
    assert (inc.node, inc.xid, inc.gpu, inc.tier, inc.state) == ("gpu-2", 79, 3, "reboot", "pending")
    assert inc.fingerprint == "82b4c842f8005a4b"
    assert [t.phase for t in rt.journal.timeline(iid)] == ["received"]


def test_duplicate_and_resolved_deliveries_make_one_incident(rt, client):
    firing = alert("gpu-4")
    for _ in range(3):
        assert client.post("/webhook", json=payload(firing), headers=AUTH).status_code == 200
    resolved = dict(firing, status="resolved")
    r = client.post("/webhook", json=payload(resolved), headers=AUTH)
    assert r.status_code == 200
    # a re-fire (new startsAt) of the same fault on another GPU within the window joins too
    refire = alert("gpu-4", gpu=5, starts_at="2026-11-30T03:50:00Z")
    assert client.post("/webhook", json=payload(refire), headers=AUTH).status_code == 200
    [inc] = rt.journal.incidents()
    assert inc.alert_count == 5 and inc.resolved_alerts == 1
    assert len(rt.journal.alerts(inc.id)) == 5


def test_alerts_for_different_nodes_make_separate_incidents(rt, client):
    r = client.post("/webhook", json=payload(alert("gpu-1"), alert("gpu-2")), headers=AUTH)
    assert len(r.json()["created"]) == 2


def test_resolved_alert_without_incident_records_no_incident(rt, client):
    r = client.post("/webhook", json=payload(alert("gpu-1", status="resolved")), headers=AUTH)
    assert r.status_code == 200 and r.json()["resolved_unmatched"] == 1
    assert rt.journal.incidents() == []


def test_unrouted_alert_is_recorded_without_incident(rt, client):
    r = client.post("/webhook", json=payload(alert("gpu-1", alertname="DiskFull")), headers=AUTH)
    assert r.status_code == 200 and r.json()["unrouted"] == 1
    assert _counts(rt) == (1, 0)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {TOKEN}x"},
    ],
)
def test_unauthenticated_requests_get_401_and_record_nothing(rt, client, headers):
    r = client.post("/webhook", content=FIXTURE.read_bytes(), headers=headers)
    assert r.status_code == 401
    assert _counts(rt) == (0, 0)


def test_oversized_body_gets_413_and_records_nothing(rt, client):
    body = payload(alert("gpu-1"))
    body["padding"] = "x" * (rt.max_body_bytes + 1)
    r = client.post("/webhook", content=json.dumps(body), headers=AUTH)
    assert r.status_code == 413
    assert _counts(rt) == (0, 0)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{",
        b"[]",
        b'{"version": "4"}',
        b"[" * 100000,
        json.dumps({**payload(alert()), "version": "3"}).encode(),
        json.dumps({**payload(alert()), "alerts": []}).encode(),
        json.dumps(payload({**alert(), "fingerprint": "not-hex!"})).encode(),
        json.dumps(payload({**alert(), "status": "exploding"})).encode(),
        json.dumps(payload({**alert(), "labels": {"bad label": "x"}})).encode(),
        json.dumps(payload({**alert(), "labels": {f"l{i}": "x" for i in range(100)}})).encode(),
    ],
)
def test_malformed_bodies_get_4xx_and_record_nothing(rt, client, body):
    r = client.post("/webhook", content=body, headers=AUTH)
    assert 400 <= r.status_code < 500
    assert _counts(rt) == (0, 0)


HOSTILE_NODES = [
    "{{ lookup('pipe', 'id') }}",
    "$(touch /tmp/pwned)",
    "gpu-1; rm -rf /",
    "gpu-1'\"",
    "gpu-1\nhosts: all",
    "../../etc/passwd",
    "a" * 300,
    "GPU-1",
    "gpu_1",
    "gpu[1-3]",
    "",
    "-gpu",
    "gpu-1 ",
    "{% raw %}",
]


@pytest.mark.parametrize("node", HOSTILE_NODES)
def test_hostile_node_names_are_refused_with_4xx_and_nothing_recorded(rt, client, node):
    r = client.post("/webhook", json=payload(alert(node=node)), headers=AUTH)
    assert r.status_code == 422
    assert _counts(rt) == (0, 0)


def test_hostile_alert_beside_a_good_one_is_neutralised_and_journaled_as_rejected(rt, client):
    r = client.post("/webhook", json=payload(alert("{{ 7*7 }}"), alert("gpu-7")), headers=AUTH)
    assert r.status_code == 200
    assert r.json()["rejected"] == 1 and len(r.json()["created"]) == 1
    outcomes = sorted(a["outcome"] for a in rt.journal.alerts())
    assert outcomes == ["incident", "rejected"]
    [inc] = rt.journal.incidents()
    assert inc.node == "gpu-7"


@pytest.mark.parametrize(
    "labels",
    [
        {"xid": "79; id"},
        {"xid": "{{ 79 }}"},
        {"xid": "-1"},
        {"xid": "1000"},
        {"xid": ""},
    ],
)
def test_hostile_xid_is_refused(rt, client, labels):
    a = alert("gpu-1")
    a["labels"].update(labels)
    assert client.post("/webhook", json=payload(a), headers=AUTH).status_code == 422
    assert _counts(rt) == (0, 0)


def test_hostile_gpu_and_annotation_text_never_reach_the_incident(rt, client):
    a = alert("gpu-1", gpu="$(reboot)")
    a["annotations"]["summary"] = "{{ lookup('pipe','id') }}"
    assert client.post("/webhook", json=payload(a), headers=AUTH).status_code == 200
    [inc] = rt.journal.incidents()
    assert inc.gpu is None
    assert "lookup" not in json.dumps(inc.as_dict())


def test_journal_failure_gives_500_and_records_nothing(rt, client, monkeypatch):
    def broken(*args, **kwargs):
        raise JournalError("disk full")

    monkeypatch.setattr(rt.intake, "apply", broken)
    r = client.post("/webhook", content=FIXTURE.read_bytes(), headers=AUTH)
    assert r.status_code == 500
    assert _counts(rt) == (0, 0)


def test_a_failed_transaction_leaves_no_partial_delivery(rt, client, monkeypatch):
    from remediation.journal import Tx

    real = Tx.create_incident
    calls = {"n": 0}

    def second_fails(self, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            import sqlite3

            raise JournalError("simulated") from sqlite3.OperationalError("disk I/O error")
        return real(self, **kw)

    monkeypatch.setattr(Tx, "create_incident", second_fails)
    r = client.post("/webhook", json=payload(alert("gpu-1"), alert("gpu-2")), headers=AUTH)
    assert r.status_code == 500
    assert _counts(rt) == (0, 0)


def test_health_ready_and_metrics(rt, client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    client.post("/webhook", content=FIXTURE.read_bytes(), headers=AUTH)
    text = client.get("/metrics").text
    assert 'autoheal_webhook_requests_total{code="200"} 1.0' in text
    assert 'autoheal_alerts_received_total{outcome="incident"} 1.0' in text
    assert "autoheal_queue_depth 1.0" in text
    assert "autoheal_circuit_breaker_open 0.0" in text


def test_get_on_webhook_is_not_allowed(client):
    assert client.get("/webhook", headers=AUTH).status_code == 405


def test_a_fault_after_the_node_came_back_is_a_new_incident_a_re_fire_before_it_is_not(rt, client):
    """Within the dedup window a closed incident absorbs re-fires of its fault, but once its run
    returned the node to service (the ladder rebooted and validated it) a fault that begins
    later is new: joining it would leave a dead GPU in service."""
    first = alert("gpu-3", starts_at="2026-11-30T03:46:01Z")
    [iid] = client.post("/webhook", json=payload(first), headers=AUTH).json()["created"]
    back = datetime(2026, 11, 30, 3, 50, tzinfo=UTC).timestamp()
    with rt.journal.transaction() as tx:
        for state in (IncidentState.ADMITTED, IncidentState.RUNNING, IncidentState.COMPLETED):
            tx.transition(iid, state, "test")
        tx.timeline(iid, "returned", "ok", source="play", ts=back)

    # the same fault re-fired (it began before the node came back): still that incident
    refire = alert("gpu-3", starts_at="2026-11-30T03:49:00Z", fingerprint="f00d")
    r = client.post("/webhook", json=payload(refire), headers=AUTH).json()
    assert r["created"] == [] and r["joined"] == [iid]
    # the GPU fails again after the node came back: a new incident, remediated again
    again = alert("gpu-3", starts_at="2026-11-30T03:55:00Z", fingerprint="f00e")
    [new] = client.post("/webhook", json=payload(again), headers=AUTH).json()["created"]
    assert new != iid and rt.journal.incident(new).state == "pending"
    # and a node retired (never returned) keeps absorbing its alerts for the window
    other = alert("gpu-4", starts_at="2026-11-30T03:46:01Z")
    [iid4] = client.post("/webhook", json=payload(other), headers=AUTH).json()["created"]
    with rt.journal.transaction() as tx:
        for state in (IncidentState.ADMITTED, IncidentState.RUNNING, IncidentState.COMPLETED):
            tx.transition(iid4, state, "test")
    later = alert("gpu-4", starts_at="2026-11-30T03:55:00Z", fingerprint="f00f")
    assert client.post("/webhook", json=payload(later), headers=AUTH).json()["joined"] == [iid4]
