"""Leader election (issue 17, Deliver 4) on a real API server: one Lease, several electors.

Each elector is the runner's own (remediation/leader.py) talking to kube-apiserver through the
official client. A replica cut off from the API server is simulated by a wrapper that makes its
calls fail (as a network partition would), the others keep the real connection.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoheal.errors import LabError
from lab import controlplane
from lab.postgres import server_bin, throwaway_server
from remediation.errors import KubeError
from remediation.executor import stop_play
from remediation.fencing import LEADER_KEY
from remediation.journal import Journal
from remediation.leader import KubeLeaseAPI, LeaseElector, Term
from remediation.states import IncidentState
from tests.faults.faulthelp import RUNBOOK_PHASES, RunnerProcess, Sink
from tests.remediation.remhelp import AUTH, alert, effect_lines, free_port, payload, write_config
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(300)
PORT_BASE = port_base(24100)
NAMESPACE = "autoheal"
# short, so the tests wait seconds, not client-go's 15 s
LEASE, DEADLINE, RETRY = 3.0, 2.0, 0.3


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not (Path.home() / ".cache/autoheal/bin/kube-apiserver").exists():
        pytest.skip("the Kubernetes control plane is not built (scripts/build-tools.sh)")
    run_dir = tmp_path_factory.mktemp("leader")
    try:
        handle = controlplane.start_control_plane(run_dir, [], PORT_BASE, timeout=120)
        with controlplane.http_client(handle.kubeconfig) as http:
            ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            http.post("/api/v1/namespaces", json=ns).raise_for_status()
        yield handle.kubeconfig
    finally:
        controlplane.stop_control_plane(run_dir)


class Cuttable:
    """A LeaseAPI that fails every call while `cut` (a replica partitioned from the API server)."""

    def __init__(self, api: KubeLeaseAPI) -> None:
        self.api, self.name, self.cut = api, api.name, False

    def _check(self) -> None:
        if self.cut:
            raise KubeError("partitioned (test)")

    def get(self) -> dict[str, Any] | None:
        self._check()
        return self.api.get()

    def create(self, body: dict[str, Any]) -> bool:
        self._check()
        return self.api.create(body)

    def replace(self, body: dict[str, Any]) -> bool:
        self._check()
        return self.api.replace(body)


class Replica:
    """One elector and the history of its leadership."""

    def __init__(self, kubeconfig: Path, lease: str, identity: str) -> None:
        self.api = Cuttable(KubeLeaseAPI(kubeconfig, NAMESPACE, lease))
        self.terms: list[Term] = []
        self.stops = 0
        self.elector = LeaseElector(
            self.api,
            identity,
            lease_seconds=LEASE,
            renew_deadline_seconds=DEADLINE,
            retry_seconds=RETRY,
            on_started=self.terms.append,
            on_stopped=self._stopped,
        )

    def _stopped(self) -> None:
        self.stops += 1


class Overlap:
    """Samples every 20 ms whether two replicas lead at once (the one thing that must never be)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas, self.seen, self._stop = replicas, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            if sum(r.elector.is_leader for r in self.replicas) > 1:
                self.seen += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.seen


def _lease(kubeconfig: Path, name: str) -> dict[str, Any]:
    lease = KubeLeaseAPI(kubeconfig, NAMESPACE, name).get()
    assert lease is not None
    return lease


def test_one_of_three_leads_and_a_stopped_leader_hands_over_at_once(kubeconfig):
    replicas = [Replica(kubeconfig, "handover", f"r{i}") for i in range(3)]
    overlap = Overlap(replicas)
    try:
        for r in replicas:
            r.elector.start()
        wait_for(lambda: any(r.elector.is_leader for r in replicas), 10, "a leader")
        time.sleep(LEASE)  # several rounds: the others stay followers
        leaders = [r for r in replicas if r.elector.is_leader]
        assert len(leaders) == 1
        first = leaders[0]
        spec = _lease(kubeconfig, "handover")["spec"]
        assert spec["holderIdentity"] == first.elector.identity
        assert spec["leaseDurationSeconds"] == round(LEASE)
        first_term = first.terms[-1].transitions

        t0 = time.monotonic()
        first.elector.stop()  # releases the Lease
        assert first.stops == 1 and not first.elector.is_leader
        wait_for(lambda: any(r.elector.is_leader for r in replicas if r is not first), 10, "a new leader")
        took = time.monotonic() - t0
        assert took < LEASE, f"a released Lease is taken at the next retry, not after expiry ({took:.2f}s)"
        [second] = [r for r in replicas if r.elector.is_leader]
        assert second.terms[-1].transitions == first_term + 1
        assert _lease(kubeconfig, "handover")["spec"]["leaseTransitions"] == first_term + 1
    finally:
        for r in replicas:
            r.elector.stop()
    assert overlap.stop() == 0


def test_a_partitioned_leader_steps_down_before_another_takes_over(kubeconfig):
    a, b = Replica(kubeconfig, "partition", "a"), Replica(kubeconfig, "partition", "b")
    overlap = Overlap([a, b])
    try:
        a.elector.start()
        wait_for(lambda: a.elector.is_leader, 10, "a to lead")
        b.elector.start()
        time.sleep(2 * RETRY)
        assert not b.elector.is_leader
        t0 = time.monotonic()
        a.api.cut = True
        wait_for(lambda: not a.elector.is_leader, DEADLINE + 2, "the cut-off leader to step down")
        stepped_at = time.monotonic()
        wait_for(lambda: b.elector.is_leader, LEASE + 3, "b to take the expired Lease")
        took = time.monotonic() - a.elector.renewed_at
        # never before the deadline counted from its last renewal (on a loaded machine that was
        # more than one retry period before the cut), and not much after the cut's deadline
        assert stepped_at - a.elector.renewed_at >= DEADLINE, (stepped_at, a.elector.renewed_at)
        assert stepped_at - t0 <= DEADLINE + 2 * RETRY, stepped_at - t0
        assert took >= LEASE, f"b must wait for the Lease to expire ({took:.2f}s after a's renewal)"
        assert a.stops == 1
        # back on the network, a is a follower: the Lease is b's and alive
        a.api.cut = False
        time.sleep(3 * RETRY)
        assert not a.elector.is_leader and b.elector.is_leader
        assert _lease(kubeconfig, "partition")["spec"]["holderIdentity"] == "b"
        assert b.terms[-1].transitions == a.terms[-1].transitions + 1
    finally:
        a.api.cut = False
        a.elector.stop()
        b.elector.stop()
    assert overlap.stop() == 0


def test_racing_for_a_free_lease_one_wins_the_other_gets_a_conflict(kubeconfig):
    """Both read the same free Lease, both replace it with that resourceVersion: one 409."""
    a, b = Replica(kubeconfig, "race", "a"), Replica(kubeconfig, "race", "b")
    assert a.elector.try_acquire_or_renew()  # creates it
    a.elector.stop()  # and releases it: holder empty
    lease = _lease(kubeconfig, "race")
    assert lease["spec"]["holderIdentity"] == ""
    won = []
    real_get = [a.api.api.get, b.api.api.get]
    a.api.api.get = lambda: lease  # type: ignore[method-assign]  # both decide on the same read
    b.api.api.get = lambda: lease  # type: ignore[method-assign]
    try:
        for r in (a, b):
            won.append(r.elector.try_acquire_or_renew())
    finally:
        a.api.api.get, b.api.api.get = real_get  # type: ignore[method-assign]
    assert won == [True, False]
    assert _lease(kubeconfig, "race")["spec"]["holderIdentity"] == "a"
    a.elector.stop()


def test_an_unreachable_api_server_is_a_follower_not_a_crash(kubeconfig, tmp_path):
    """A kubeconfig whose server does not answer: the elector keeps trying and never leads."""
    text = kubeconfig.read_text()
    server = next(line.split("server:", 1)[1].strip() for line in text.splitlines() if "server:" in line)
    dead = tmp_path / "kubeconfig"
    dead.write_text(text.replace(server, "https://127.0.0.1:1"))
    r = Replica(dead, "unreachable", "x")
    r.elector.round()
    r.elector.round()
    assert not r.elector.is_leader and r.terms == []
    assert "127.0.0.1" in r.elector.last_error or "refused" in r.elector.last_error.lower()


# --- two runner processes, one journal: the leader killed in the middle of a play -------------


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """The replicas' shared journal: a private PostgreSQL server (lab/postgres.py)."""
    try:
        server_bin()
    except LabError as exc:
        pytest.fail(f"PostgreSQL is not installed (scripts/bootstrap.sh installs it): {exc}")
    with throwaway_server(PORT_BASE + 20, prefix="autoheal-ha-pg-") as server:
        yield server.dsn()


def _leader(dsn: str) -> dict[str, Any]:
    j = Journal.postgres(dsn)
    try:
        return dict(j.setting(LEADER_KEY) or {})
    finally:
        j.close()


def _replica(
    tmp: Path, name: str, kubeconfig: Path, dsn: str, sink: Sink, env: dict[str, str]
) -> RunnerProcess:
    port = free_port()
    cfg = write_config(
        tmp / name,
        listen_port=port,
        journal_path=None,
        journal_dsn=dsn,
        kubeconfig=str(kubeconfig),
        notify=[{"url": sink.url, "retries": 0}],
        leader_election={"enabled": True, "namespace": NAMESPACE, "lease_name": "failover", "identity": name},
    )
    return RunnerProcess(tmp / name, cfg, port, env)


class Poster:
    """Alertmanager's side: a delivery every 0.2 s to one replica, every reply code kept."""

    def __init__(self, url: str, nodes: list[str]) -> None:
        self.url, self.nodes, self.codes = url, nodes, Counter[int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.wait(0.2):
                body = payload(*(alert(n) for n in self.nodes))
                try:
                    self.codes[http.post(f"{self.url}/webhook", json=body, headers=AUTH).status_code] += 1
                except httpx.HTTPError:
                    self.codes[0] += 1

    def stop(self) -> Counter[int]:
        self._stop.set()
        self._thread.join()
        return self.codes


def test_leader_killed_mid_play_the_follower_resumes_and_every_alert_is_accepted(
    kubeconfig, pg_dsn, tmp_path
):
    """Failover figures (closing note): leader killed -> new leader acting; alerts answered
    during the failover; incidents run twice."""
    journal = pg_dsn
    effects = tmp_path / "effects.log"
    sink = Sink(free_port())
    sink.start()
    env = {
        "AUTOHEAL_STUB_EFFECTS": str(effects),
        "AUTOHEAL_STUB_PHASES": RUNBOOK_PHASES,
        "AUTOHEAL_STUB_SLEEP_PHASE": "spare_promoted",
        "AUTOHEAL_STUB_SLEEP": "60",
        "AUTOHEAL_STUB_SLEEP_ONCE": str(tmp_path / "slept"),
    }
    a = _replica(tmp_path, "a", kubeconfig, journal, sink, env)
    b = _replica(tmp_path, "b", kubeconfig, journal, sink, env)
    poster: Poster | None = None
    try:
        first = a.start()
        wait_for(lambda: _leader(journal).get("holder") == "a", 20, "a to lead and claim the journal")
        b.start()
        r = httpx.post(f"{b.url}/webhook", json=payload(alert("gpu-1")), headers=AUTH, timeout=10)
        assert r.status_code == 200, r.text  # the follower journals it; the leader runs it
        [iid] = r.json()["created"]
        wait_for(lambda: "spare_promoted gpu-1" in effect_lines(effects), 60, "a's play inside a step")
        poster = Poster(b.url, ["gpu-2", "gpu-3"])
        time.sleep(0.5)
        killed = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
        wait_for(lambda: _leader(journal).get("holder") == "b", 30, "b to lead")
        claimed = float(_leader(journal)["since"])
        j = Journal.postgres(journal)
        try:
            wait_for(lambda: "resumed" in [t.phase for t in j.timeline(iid)], 30, "b to resume a's run")
            resumed = min(t.ts for t in j.timeline(iid) if t.phase == "resumed")
            time.sleep(1.0)  # deliveries after the failover, too
            codes = poster.stop()
            poster = None
            incidents = j.incidents()
            wait_for(lambda: all(not j.require_incident(i.id).is_open for i in incidents), 90, "all closed")
            states = {j.require_incident(i.id).node: j.require_incident(i.id).state for i in incidents}
            timeline = j.timeline(iid)
        finally:
            j.close()
        print(
            f"\nfailover: leader killed -> b claimed the journal {claimed - killed:.2f} s,"
            f" -> a's run resumed {resumed - killed:.2f} s; deliveries to the follower: {dict(codes)}"
        )
        assert claimed - killed <= 15.0
        assert set(codes) == {200} and sum(codes.values()) >= 10, codes  # no error, none refused
        assert states == {n: IncidentState.COMPLETED for n in ("gpu-1", "gpu-2", "gpu-3")}, states
        assert [t.phase for t in timeline].count("resolved") == 1
        counts = Counter(effect_lines(effects))
        for phase in RUNBOOK_PHASES.split(","):
            assert counts[f"{phase} gpu-1"] == (2 if phase == "spare_promoted" else 1), (phase, counts)
            for node in ("gpu-2", "gpu-3"):
                assert counts[f"{phase} {node}"] == 1, (phase, node, counts)  # run once, by b
        # the pages go out from the notifier's own thread, just after each incident closed
        wait_for(lambda: len(sink.named("incident.completed")) >= 3, 15, "one page per incident")
        assert len(sink.named("incident.completed")) == 3
    finally:
        if poster is not None:
            poster.stop()
        a.stop_all()
        b.stop_all()
        sink.stop()
        j = Journal.postgres(journal)
        for run in j.runs():
            if run.play_pid:
                stop_play(run.play_pid)
        j.close()
