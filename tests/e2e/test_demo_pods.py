"""The demo on Slurm on Kubernetes (issue 14): `autoheal lab demo`'s default story, end to end.

A pods lab of its own: three real GPU nodes (two train, one hot spare) and a system node, on which
`pulumi up` of the repository's stack brings slurmctld, login, the slurmd pods and the runner's
pod. The example training job is submitted with `sbatch` over ssh to the login pod, XID 79 is
injected on one of its nodes, and its GPU stays dead after the reboot. From then on only the
runner in its pod acts, as its ServiceAccount: the node is fenced in Slurm and cordoned, the job
gets SIGTERM inside its slurmd pod, checkpoints and is requeued onto the promoted spare, the node
is drained, rebooted, fails validation and is retired; the pool brings a new real node, whose
slurmd pod joins Slurm as a drained hot spare; training resumes from its checkpoint.

Checked where it happened: the report's phases, Slurm through the login pod, Kubernetes, the
runner's journal on its PersistentVolume and the API server's audit log (every write of the
runbook made by the runner's ServiceAccount), and the job's own progress.
"""

from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

import pytest
from rich.console import Console

from autoheal.labels import SPARE_REASON
from lab import controlplane, demo, runner, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from tests.nodes.conftest import require_real_nodes
from tests.support import port_base, wait_for

PORT_BASE = port_base(25700)
RUNNER_SA = "system:serviceaccount:autoheal:autoheal-runner"

pytestmark = [pytest.mark.lab, pytest.mark.kube, pytest.mark.timeout(2400)]


def _sinfo(login: Login) -> dict[str, tuple[str, str]]:
    """node -> (state, reason) as the researcher sees it."""
    rows = login.run("sinfo -h -N -o '%N|%t|%E'").splitlines()
    return {r.split("|")[0]: (r.split("|")[1], r.split("|")[2]) for r in rows if r.count("|") == 2}


def test_pods_demo_the_in_cluster_runner_heals_an_xid_79(tmp_path: Path) -> None:
    require_real_nodes()
    if not stack.available():
        pytest.skip("PODS DEMO NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None:
        pytest.skip("PODS DEMO NOT TESTED: the ssh client is not installed")
    cfg = LabConfig(
        name="e2e-pods",
        root=tmp_path / "labs",
        port_base=PORT_BASE,
        pools=[PoolConfig(size=2, spares=1, headroom=3)],
        slurm="pods",
        grace_seconds=30,
        provision_delay=1,
    )
    quiet = Console(file=io.StringIO(), width=120)
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        print(f"\n[pods demo] lab up with pulumi up: {time.monotonic() - t0:.1f}s")
        demo.check_healthy(cfg)
        login = Login(cfg)
        before = _sinfo(login)
        assert sorted(before) == ["gpu-1", "gpu-2", "gpu-3"], before
        # the spare registered itself drained, with the reason autoheal owns
        assert before["gpu-3"][0] == "drain" and before["gpu-3"][1] == SPARE_REASON, before

        report = demo.trial(cfg, tmp_path / "demo", quiet, quiet, timeout=300, cleanup=True, live=False)
        node = report["faulty_node"]
        seen = {p["phase"]: p["t_plus_s"] for p in report["phases"] if p["t_plus_s"] is not None}
        print(f"[pods demo] phases (s after the fault): {json.dumps(seen)}")
        for phase in ("received", "fenced", "requeued", "job_running", "first_step"):
            assert phase in seen, f"phase {phase} missing from the report: {seen}"
        assert seen["received"] <= seen["fenced"] <= seen["job_running"] <= seen["first_step"]
        assert report["final_step"] > report["pre_fault_step"]

        # the job resumed on the promoted spare, not on the faulty node
        after = login.run(f"scontrol show hostnames {report['nodes_after']}").split()
        assert node not in after and "gpu-3" in after, after

        # the runner's journal (on its PersistentVolume): fenced, signalled, requeued, promoted,
        # drained, then the ladder in the background (the job did not wait for it): rebooted,
        # validation failed, retired
        def phases() -> dict[str, str]:
            j = runner.open_journal(cfg)
            assert j is not None
            try:
                return {e.phase: e.status for e in j.timeline(report["incident"])}
            finally:
                j.close()

        wait_for(lambda: "recover_failed" in phases(), 300, "the ladder to retire the node")
        phases_seen = phases()
        print(f"[pods demo] incident phases: {phases_seen}")
        for phase in (
            "fenced",
            "jobs_signalled",
            "requeued",
            "spare_promoted",
            "drained",
            "rebooted",
            "retired",
        ):
            assert phases_seen.get(phase) == "ok", (phase, phases_seen)

        # the retired node left Kubernetes and Slurm; a new real node joined Slurm as a spare
        def joined() -> str | None:
            now = _sinfo(login)
            new = [n for n in now if n not in before]
            if node in now or not new:
                return None
            return new[0] if now[new[0]] == ("drain", SPARE_REASON) else None

        new = wait_for(joined, 240, "the retired node to leave Slurm and a new spare to join")
        print(f"[pods demo] {node} retired; {new} joined Slurm as a drained hot spare")
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            names = {n["metadata"]["name"] for n in http.get("/api/v1/nodes").json()["items"]}
        assert node not in names and new in names

        # least privilege on the real API server: the runbook's writes came from the runner's
        # ServiceAccount (the lab's admin made none to nodes or evictions)
        writes = [
            e
            for e in controlplane.audit_log(cfg.run_dir)
            if e.get("verb") in ("patch", "create")
            and e.get("objectRef", {}).get("resource") in ("nodes", "pods")
            and e.get("objectRef", {}).get("name") == node
        ]
        users = {e["user"]["username"] for e in writes}
        assert RUNNER_SA in users, users
        login.close()
    finally:
        labmod.down(cfg)
