"""The worker under leader election (issue 17, Deliver 4), in process: it acts only in a term it
claimed, a deposed worker cancels its play and writes nothing more, and the next leader resumes
that run from the journal. Two runtimes on one journal stand for two replicas; the elector's
calls (lead / depose) are made by the test, the Lease itself is tested in tests/faults/test_ha.py.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from starlette.testclient import TestClient

from remediation.app import create_app
from remediation.fencing import LEADER_KEY
from remediation.inflight import RunKind
from remediation.leader import Term
from remediation.runtime import build
from remediation.states import IncidentState, RunStatus
from tests.remediation.remhelp import AUTH, alert, effect_lines, make_config, payload
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)
RUNBOOK = ["fenced", "jobs_signalled", "requeued", "drained", "replacement_ready"]


@pytest.fixture
def replicas(tmp_path, kube):
    """replica(name) -> (runtime, client): its own state dir, the shared journal, election on."""
    kubeconfig = tmp_path / "kubeconfig"  # loaded, never called: the test drives lead/depose
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    opened = []

    def replica(name: str):
        cfg = make_config(
            tmp_path / name,
            journal_path=str(tmp_path / "journal.sqlite"),
            kubeconfig=str(kubeconfig),
            leader_election={"enabled": True, "identity": name},
        )
        rt = build(cfg, kube=kube)
        rt.elector = None  # not started: the test is the elector
        client = TestClient(create_app(rt))
        client.__enter__()
        opened.append(client)
        return rt, client

    yield replica
    for client in opened:
        client.__exit__(None, None, None)


def test_a_follower_journals_alerts_but_runs_nothing_until_it_leads(replicas, effects):
    rt, client = replicas("a")
    r = client.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH)
    assert r.status_code == 200
    [iid] = r.json()["created"]
    time.sleep(1.0)
    assert rt.journal.incident(iid).state == IncidentState.PENDING and effect_lines(effects) == []
    assert not rt.worker.leading
    rt.worker.lead(Term("a", 3))
    wait_for(lambda: rt.journal.incident(iid).state == IncidentState.COMPLETED, 60, "the leader to run it")
    assert rt.journal.setting(LEADER_KEY)["holder"] == "a" and rt.journal.setting(LEADER_KEY)["term"] == 3


def test_a_deposed_leader_cancels_its_play_and_the_next_leader_resumes_it_once(
    replicas, effects, monkeypatch, tmp_path
):
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_PHASE", "requeued")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP", "60")
    monkeypatch.setenv("AUTOHEAL_STUB_SLEEP_ONCE", str(tmp_path / "slept"))
    a, client_a = replicas("a")
    b, _ = replicas("b")
    a.worker.lead(Term("a", 1))
    [iid] = client_a.post("/webhook", json=payload(alert("gpu-1")), headers=AUTH).json()["created"]
    wait_for(lambda: "requeued gpu-1" in effect_lines(effects), 60, "a's play inside the requeue step")
    t0 = time.monotonic()
    a.worker.depose()
    b.worker.lead(Term("b", 2))
    wait_for(lambda: b.journal.incident(iid).state == IncidentState.COMPLETED, 90, "b to finish it")
    took = time.monotonic() - t0
    runs = b.journal.runs_of(iid)
    assert [r.status for r in runs] == [RunStatus.INTERRUPTED, RunStatus.SUCCESSFUL], runs
    assert "resumed" in [t.phase for t in b.journal.timeline(iid)]
    counts = Counter(effect_lines(effects))
    assert {p: counts[f"{p} gpu-1"] for p in RUNBOOK} == {
        "fenced": 1,
        "jobs_signalled": 1,
        "requeued": 2,  # the step in flight when a was deposed, redone once by b
        "drained": 1,
        "replacement_ready": 1,
    }
    assert took < 30, f"a's play was not cancelled promptly ({took:.1f}s)"
    assert not a.worker.leading
    wait_for(lambda: a.worker.inflight.count(RunKind.FULL) == 0, 30, "a's cancelled run to wind down")
    # a's late writes were refused: nothing of a's run after the deposition reached the journal
    assert a.journal.run(runs[0].id).status == RunStatus.INTERRUPTED
