"""Dead nodes leave Slurm (issue 32, Deliver 5), on real nodes and the stack's real Slurm.

A lab of two real GPU nodes; `pulumi up` brings slurmctld and a slurmd pod per node, each a
dynamic Slurm node (`slurmd -Z`); MaxNodeCount is the pool's size (no headroom), so one dead
record is enough to stop a replacement from registering. A 2-node job runs on both. Then one of
them (gpu-1 below; gpu-2 when the scheduler put slurmctld's pod on gpu-1, which the test reads)
dies as an instance does: kill -9 of its kubelet and containerd, then of what is left of the
machine (the container shims and the slurmd they run, all in the node's own cgroup: the lab's
own processes, by PID), and its Node is deleted. The dead-node loop (remediation/dead_nodes.py,
as the leader runs it) waits while slurmctld still has the job on gpu-1, then deletes the record
once slurmctld marked the node DOWN and requeued the job; a replacement real node registers and
the job runs again on gpu-2 and the replacement. The lab's host Slurm (static slurm.conf nodes,
the host-slurmd lab) keeps its gpu-1 although no Node of that name exists any more.

Slurm in pods speaks 24.11, which the host's 22.05 client cannot talk to, so the loop's Slurm
commands run in the slurmctld pod (kubectl exec), the same binaries the runner's pod carries.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab import controlplane, procs, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from lab.nodes import cgroups, cluster, net, podreport
from lab.nodes.node import proc_name
from lab.pool import node_labels, node_taints
from remediation.cordon_sync import KubeNodes, SlurmCli, SyncJournal
from remediation.dead_nodes import DeadNodes
from tests.nodes.conftest import require_real_nodes
from tests.support import pid_alive, port_base, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.timeout(1500)]
GRACE = 10.0  # the loop's grace for a Node gone (the runner's default: 30 s)


class PodSlurm(SlurmCli):
    """The stack's Slurm through `kubectl exec` into the slurmctld pod (the 24.11 client)."""

    def __init__(self, kubeconfig: Path) -> None:
        super().__init__(None)
        self._argv = [
            str(controlplane.tool_path("kubectl")),
            f"--kubeconfig={kubeconfig}",
            "exec",
            "-n",
            "slurm",
            "slurmctld-0",
            "-c",
            "slurmctld",
            "--",
        ]

    def _run(self, *argv: str) -> str:
        res = subprocess.run([*self._argv, *argv], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])}: rc={res.returncode}: {res.stderr.strip()[:300]}")
        return res.stdout


def _fields(slurm: PodSlurm, job: str) -> dict[str, str]:
    out = slurm._run("scontrol", "show", "job", job, "-o")
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _job(slurm: PodSlurm, job: str) -> tuple[str, str]:
    fields = _fields(slurm, job)
    return fields.get("JobState", ""), fields.get("NodeList", "")


# where the job runs again: on the survivor and the replacement gpu-3
RESUMED_ON = {"gpu-1": "gpu-[2-3]", "gpu-2": "gpu-[1,3]"}


def _slurmctld_node(cfg: LabConfig) -> str:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        pod = http.get("/api/v1/namespaces/slurm/pods/slurmctld-0").json()
    return str(pod["spec"]["nodeName"])


def _kill_machine(cfg: LabConfig, node: str) -> list[int]:
    """kill -9 of the node's kubelet and containerd, then of everything else in its cgroup (the
    shims, slurmd and the job's processes): a machine gone, not a shutdown. The lab's own
    processes only, by PID."""
    running = procs.running(cfg.run_dir)
    killed = []
    for service in ("kubelet", "containerd"):
        p = running[proc_name(node, service)]
        os.kill(p.pid, signal.SIGKILL)
        killed.append(p.pid)
    group = cgroups.node_group(net.lab_id(cfg.run_dir), node)
    for pid in cgroups.pids(group):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    wait_for(
        lambda: not [p for p in cgroups.pids(group) if pid_alive(p)], 30, f"every process of {node} to die"
    )
    return killed


def _wait_registered(cfg: LabConfig, slurm: PodSlurm, node: str) -> None:
    """Until `node` is a Slurm node. Its slurmd has been refused while the dead record held the
    last MaxNodeCount slot, and retries on a growing delay at debug level (slurmd.c's
    _registration_engine doubles it up to 128 s); a fresh-clone run saw it still unregistered 240 s
    after the deletion, with nothing in its log. The slurmd container's liveness probe now restarts
    a slurmd that Slurm has no record of (components/slurm/workers.py), so it registers anew about
    a minute after the slot comes free (88 s measured). A timeout names what the slurmd pods were
    doing."""
    try:
        wait_for(lambda: node in slurm.nodes(), 128 + 112, f"the replacement {node} registered in Slurm")
    except AssertionError as exc:
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            pods = http.get("/api/v1/namespaces/slurm/pods").json()["items"]
        where = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase")) for p in pods]
        raise AssertionError(f"{exc}\npods: {where}\n{podreport.report(cfg.kubeconfig, ['slurm'])}") from None


def test_a_dead_nodes_slurm_record_is_deleted_once_its_job_is_requeued(tmp_path: Path) -> None:
    require_real_nodes()
    if not stack.available():
        pytest.skip("DEAD NODES NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None:
        pytest.skip("DEAD NODES NOT TESTED: the ssh client is not installed")
    cfg = LabConfig(
        name="a-deadnode",
        root=tmp_path,
        port_base=port_base(22200),
        pools=[PoolConfig(size=2, spares=0, headroom=0, gpus_per_node=4)],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    reaper: DeadNodes | None = None
    victim = "gpu-1"
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        stack.up(cfg)
        print(f"\n[dead nodes] lab + pulumi up on 2 real nodes: {time.monotonic() - t0:.1f}s")
        slurm = PodSlurm(cfg.kubeconfig)
        before = slurm.nodes()
        assert sorted(before) == ["gpu-1", "gpu-2"] and before["gpu-1"].dynamic, before
        config = slurm._run("scontrol", "show", "config")
        assert re.search(r"^MaxNodeCount\s*=\s*2$", config, re.M), "MaxNodeCount is not the pool's 2"

        login = Login(cfg)  # submitted as a researcher does; read in slurmctld's pod (ssh may pick gpu-1)
        job = login.run("sbatch --parsable -N 2 -p h100 --requeue --wrap 'srun sleep 900'").strip()
        login.close()
        wait_for(lambda: _job(slurm, job)[0] == "RUNNING", 60, f"job {job} running")
        assert _job(slurm, job)[1] == "gpu-[1-2]"

        # the machine that dies is not the one slurmctld's pod runs on (the test reads Slurm there;
        # the scheduler may have put it on either node)
        victim = next(n for n in ("gpu-1", "gpu-2") if n != _slurmctld_node(cfg))
        journal = SyncJournal(tmp_path / "dead-nodes.jsonl")
        deleted: list[str] = []
        reaper = DeadNodes(
            KubeNodes(cfg.kubeconfig), slurm, journal, grace=GRACE, interval=2, deleted=deleted.append
        )
        assert [v for v in reaper.reconcile() if v.node == victim] == []  # alive: nothing to say
        reaper.start()

        t1, wall1 = time.monotonic(), time.time()
        killed = _kill_machine(cfg, victim)
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            assert http.delete(f"/api/v1/nodes/{victim}").status_code == 200
        print(f"[dead nodes] {victim} killed ({len(killed)} processes, kill -9) and its Node deleted")

        # past the grace, slurmctld still has the job on the victim (it has not noticed the loss yet):
        # the record stays
        wait_for(lambda: reaper._waiting.get(victim) == "jobs", 60, f"the loop to wait for {victim}'s job")
        assert victim in slurm.nodes() and not deleted
        t_wait = time.monotonic() - t1

        # the replacement starts meanwhile; it can only register once the dead record is gone
        cluster.add(cfg.run_dir, "gpu-3", node_labels(cfg.pools[0], False), node_taints(False), 4)

        wait_for(lambda: deleted == [victim], 180, f"{victim}'s record deleted")
        assert victim not in slurm.nodes()
        state, nodes = _job(slurm, job)
        assert victim not in nodes or state == "PENDING", (state, nodes)
        rows = [json.loads(x) for x in journal.path.read_text().splitlines()]
        assert [(r["node"], r["action"]) for r in rows] == [(victim, "delete")]
        t_deleted = rows[0]["ts"] - wall1

        _wait_registered(cfg, slurm, "gpu-3")
        t_joined = time.monotonic() - t1
        wait_for(lambda: _job(slurm, job) == ("RUNNING", RESUMED_ON[victim]), 120, f"job {job} running again")
        t_resumed = time.monotonic() - t1
        assert sorted(slurm.nodes()) == sorted({"gpu-1", "gpu-2", "gpu-3"} - {victim})
        assert int(_fields(slurm, job)["Restarts"]) >= 1  # slurmctld requeued it, nobody else did
        print(
            f"[dead nodes] after the kill, s: the loop waits on the job {t_wait:.1f} ({rows[0]['why']}),"
            f" record deleted {t_deleted:.1f}, replacement registered {t_joined:.1f}"
            f" ({t_joined - t_deleted:.1f} after the deletion), job running again {t_resumed:.1f}"
        )

        # static slurm.conf nodes (the lab's host Slurm) are never deleted: no Node of the victim either
        host = SlurmCli(cfg.slurm_conf)
        static = DeadNodes(KubeNodes(cfg.kubeconfig), host, SyncJournal(tmp_path / "static.jsonl"), grace=0)
        assert not host.nodes()[victim].dynamic
        assert [v for v in static.reconcile() if v.verb == "delete"] == []
        static.reconcile()
        assert victim in host.nodes() and not (tmp_path / "static.jsonl").exists()
    finally:
        if reaper is not None:
            reaper.stop()
        cluster.remove(cfg.run_dir, victim)
        labmod.down(cfg)
