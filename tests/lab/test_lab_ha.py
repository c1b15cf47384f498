"""The lab runs what production runs in HA: two runner replicas sharing the lab's PostgreSQL
journal, electing their leader on a Lease of the lab's control plane, Alertmanager posting to both.
A `kill -9` of the leader hands over to the other within the Lease's duration; `down` leaves no
runner and no PostgreSQL process behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml
from pydantic import ValidationError

from autoheal.errors import LabError
from lab import lab as labmod
from lab import procs, prom, runner
from lab.config import PORTS, LabConfig, PoolConfig
from remediation.config import load_config
from remediation.states import IncidentState
from tests.support import pid_alive, port_base, processes_pointing_into, wait_for

pytestmark = pytest.mark.timeout(240)
PORT_BASE = port_base(23000)
FAILOVER_S = 15.0  # the Lease lasts 8 s and is retried every second (remediation/config.py)


def _require_tools() -> None:
    if not labmod.kube_available() or not labmod.runner_available():
        pytest.skip("the lab's Kubernetes tools or the runner are not built (scripts/build-tools.sh)")
    try:
        from lab.postgres import server_bin

        server_bin()
    except LabError as exc:
        pytest.skip(str(exc))


def _leaders(cfg: LabConfig) -> dict[str, bool | None]:
    out: dict[str, bool | None] = {}
    for svc in cfg.runner_services:
        try:
            out[svc] = runner.leads(cfg, svc)
        except httpx.HTTPError:
            out[svc] = None  # not answering (killed)
    return out


def _lease(cfg: LabConfig) -> dict:
    from lab import controlplane

    with controlplane.http_client(cfg.kubeconfig) as http:
        r = http.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{runner.LEASE_NAMESPACE}/leases/{runner.LEASE_NAME}"
        )
        r.raise_for_status()
        return r.json()


def _leader_cli(cfg: LabConfig) -> dict:
    """`autoheal leader --json`: the leader the shared journal records."""
    cli = Path(sys.executable).with_name("autoheal")
    res = subprocess.run(
        [str(cli), "leader", "--json", "--config", str(runner.config_path(cfg, 1))],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _incidents(cfg: LabConfig, node: str) -> list:
    j = runner.open_journal(cfg)
    assert j is not None
    try:
        return [i for i in j.incidents() if i.node == node]
    finally:
        j.close()


def test_replicas_need_the_postgres_journal_and_the_control_plane() -> None:
    with pytest.raises(ValidationError, match=r"runner_replicas: 2 .*set runner_journal: postgres"):
        LabConfig(runner_replicas=2)
    with pytest.raises(ValidationError, match=r"runner_replicas: 2 .*Kubernetes Lease; set kube: true"):
        LabConfig(runner_replicas=2, runner_journal="postgres", kube=False)
    with pytest.raises(ValidationError, match="runner_replicas"):
        LabConfig(runner_replicas=4, runner_journal="postgres")
    assert LabConfig(runner_journal="postgres", kube=False).runner_services == ["runner"]


def test_each_replica_has_its_port_config_and_webhook(tmp_path: Path) -> None:
    cfg = LabConfig(root=tmp_path, port_base=PORT_BASE, runner_journal="postgres", runner_replicas=3)
    assert cfg.runner_services == ["runner", "runner-1", "runner-2"]
    assert len(set(PORTS.values())) == len(PORTS)  # no two services share an offset
    assert cfg.port("runner") == PORT_BASE + 5  # replica 0 keeps the one runner's port and URLs
    assert cfg.effective_webhook_url == cfg.url("runner", "/webhook")

    (tmp_path / "token").write_text("t")
    am = prom.alertmanager_config(cfg, tmp_path / "token")
    hooks = next(r for r in am["receivers"] if r.get("webhook_configs"))["webhook_configs"]
    assert (
        [h["url"] for h in hooks] == cfg.webhook_urls == [cfg.url(s, "/webhook") for s in cfg.runner_services]
    )
    assert "&id" not in yaml.safe_dump(am)  # each its own mapping: no YAML anchors for Alertmanager
    alone = cfg.model_copy(update={"webhook_url": "http://127.0.0.1:1/hook"})
    assert alone.webhook_urls == ["http://127.0.0.1:1/hook"]

    confs = [load_config(runner.write_config(cfg, replica=i), env={}) for i in range(3)]
    assert [c.listen_port for c in confs] == [cfg.port(s) for s in cfg.runner_services]
    assert {c.journal_dsn for c in confs} == {runner.journal_dsn(cfg)} and {
        c.journal_path for c in confs
    } == {None}
    assert len({c.state_dir for c in confs}) == 3
    assert [c.leader_election.identity for c in confs] == ["runner-0", "runner-1", "runner-2"]
    assert all(c.leader_election.enabled and c.leader_election.namespace == "default" for c in confs)
    with pytest.raises(LabError, match="PostgreSQL"):
        runner.journal_path(cfg)


@pytest.mark.lab
@pytest.mark.kube
def test_two_replicas_share_postgres_elect_one_leader_and_fail_over() -> None:
    _require_tools()
    # not under tmp_path: pytest's folders are closed to the `postgres` user the server runs as
    root = Path(tempfile.mkdtemp(prefix="autoheal-lab-ha-"))
    root.chmod(0o755)
    cfg = LabConfig(
        name="ha",
        root=root,
        port_base=PORT_BASE,
        pools=[PoolConfig(size=1, spares=0, headroom=0, gpus_per_node=1)],
        kube=True,
        runner=True,
        runner_journal="postgres",
        runner_replicas=2,
        watchers=False,
        grace_seconds=5,
        provision_delay=1,
    )
    pids: dict[str, int] = {}
    try:
        try:
            _exercise(cfg, pids)
        finally:
            t_down = time.monotonic()
            done = labmod.down(cfg)
            print(f"[ha] down: {done.summary()} in {time.monotonic() - t_down:.1f}s")
        assert procs.running(cfg.run_dir) == {}
        assert [n for n, pid in pids.items() if pid_alive(pid)] == []
        assert processes_pointing_into(cfg.run_dir, cfg.socket_dir) == {}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _exercise(cfg: LabConfig, pids: dict[str, int]) -> None:
    t0 = time.monotonic()
    labmod.up(cfg)
    print(f"\n[ha] lab up with 2 replicas and postgres: {time.monotonic() - t0:.1f}s")
    live = procs.running(cfg.run_dir)
    pids.update({n: live[n].pid for n in ("postgres", "runner", "runner-1")})

    # PostgreSQL answers, and holds the replicas' journal; both replicas are ready
    with psycopg.connect(runner.journal_dsn(cfg), connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("autoheal",)
    for svc in cfg.runner_services:
        assert httpx.get(cfg.url(svc, "/readyz"), timeout=5).status_code == 200

    # exactly one leads; the Lease, the journal and `lab status` name it
    wait_for(lambda: sorted(map(bool, _leaders(cfg).values())) == [False, True], 15, "one leader")
    leader = next(s for s, lead in _leaders(cfg).items() if lead)
    other = next(s for s in cfg.runner_services if s != leader)
    identity = {"runner": "runner-0", "runner-1": "runner-1"}
    assert _lease(cfg)["spec"]["holderIdentity"] == identity[leader]
    wait_for(lambda: _leader_cli(cfg).get("holder") == identity[leader], 10, "the journal's leader record")
    status = {s.name: s for s in labmod.status(cfg).services}
    assert all(status[n].healthy for n in ("postgres", "runner", "runner-1")), status
    assert status[leader].detail == "ready, leader" and status[other].detail == "ready, follower", status

    # Alertmanager posts to both replicas
    am = httpx.get(cfg.url("alertmanager", "/api/v2/status"), timeout=5).json()["config"]["original"]
    assert all(cfg.url(s, "/webhook") in am for s in cfg.runner_services), am

    # kill -9 the leader: it releases nothing, the other takes over once the Lease expires
    os.kill(pids[leader], signal.SIGKILL)
    t_kill = time.monotonic()
    wait_for(lambda: _leaders(cfg)[other], FAILOVER_S, f"{other} to lead after the leader was killed")
    print(f"[ha] {other} leads {time.monotonic() - t_kill:.1f}s after kill -9 of {leader}")
    assert _lease(cfg)["spec"]["holderIdentity"] == identity[other]
    wait_for(lambda: _leader_cli(cfg).get("holder") == identity[other], 10, "the journal's new leader")

    # an XID reaches the survivor through the real pipeline, and the new leader acts on it
    labmod.inject(cfg, "gpu-1", 0, 79)
    acted = wait_for(
        lambda: [i for i in _incidents(cfg, "gpu-1") if i.state is not IncidentState.PENDING],
        30,
        "the new leader to take on the incident of gpu-1",
    )
    assert len(_incidents(cfg, "gpu-1")) == 1, acted


@pytest.mark.lab
def test_down_ends_what_a_runners_play_left_and_nothing_of_another_lab(tmp_path: Path) -> None:
    """A task's shell ignores SIGHUP: when its runner stops, it is init's child, found only by the
    run dir every runner of the lab carries in its environment (lab.runner.RUN_DIR_ENV)."""
    mine = LabConfig(name="plays", root=tmp_path, port_base=PORT_BASE)
    other = LabConfig(name="plays-other", root=tmp_path, port_base=PORT_BASE)

    def task(cfg: LabConfig) -> subprocess.Popen[bytes]:
        env = {**os.environ, runner.RUN_DIR_ENV: str(cfg.run_dir)}
        return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)

    left, others = task(mine), task(other)
    try:
        wait_for(lambda: runner.play_processes(mine), 5, "the task to show its environment")
        assert [pid for pid, _ in runner.play_processes(mine)] == [left.pid]
        done = labmod.down(mine)
        assert left.wait(5) == -signal.SIGTERM
        assert done.play_processes == 1 and "1 play process left by runners" in done.summary()
        assert others.poll() is None
    finally:
        for p in (left, others):
            p.kill()
            p.wait()
