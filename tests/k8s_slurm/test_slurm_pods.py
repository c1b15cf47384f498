"""SlurmCluster on the lab's real nodes: `pulumi up` with rollout waits goes green, a researcher
ssh-es to the login Service with the declared key, `sbatch`es a 2-node job whose steps run in the
slurmd pods with only the GPU Slurm gave each (device cgroups), and a slurmd pod that stops takes its node out of Slurm until its successor joins.

Skipped only when the real-node tools are missing (as tests/nodes). Prints what it measured:
`pulumi up` time, pod start times and the sbatch round trip.
"""

from __future__ import annotations

import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from lab import controlplane, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from lab.nodes import podreport
from tests.nodes.conftest import require_real_nodes
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(1500)
NS = "slurm"
JOB = """#!/bin/bash
#SBATCH -N 2
#SBATCH --gres=gpu:h100:1
#SBATCH -o job-%j.out
cat > step-$SLURM_JOB_ID.sh <<'EOF'
# the GPU devices this step may open (no driver: ENXIO); its device cgroup refuses the others (EPERM)
mine=""
for d in /dev/nvidia*; do
  case "$( (exec 3<"$d") 2>&1 )" in *"not permitted"*) ;; *) mine="$mine ${d#/dev/}" ;; esac
done
echo "$(hostname) $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES$mine $(ls /dev/nvidia* | wc -l)"
EOF
srun bash step-$SLURM_JOB_ID.sh
"""


def _get(cfg: LabConfig, path: str) -> Any:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get(path)
        r.raise_for_status()
        return r.json()


def _pods(cfg: LabConfig) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = _get(cfg, f"/api/v1/namespaces/{NS}/pods")["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _start_seconds(pod: dict[str, Any]) -> float:
    """Created -> Ready, from the pod's own timestamps."""
    made = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return (datetime.fromisoformat(ready["lastTransitionTime"]) - made).total_seconds()


def _job_state(login: Login, job: str) -> str:
    out = login.run(f"scontrol show job {job} -o")
    return next(f.split("=", 1)[1] for f in out.split() if f.startswith("JobState="))


def test_pulumi_up_on_real_nodes_then_sbatch_over_ssh_runs_in_the_slurmd_pods(tmp_path: Path) -> None:
    require_real_nodes()
    if not stack.available():
        pytest.skip("SLURM PODS NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        pytest.skip("SLURM PODS NOT TESTED: the ssh client is not installed")
    cfg = LabConfig(
        name="a-k8sslurm",
        root=tmp_path,
        port_base=port_base(27900),
        pools=[PoolConfig(size=2, spares=0, headroom=1, gpus_per_node=4)],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    try:
        labmod.up(cfg)
        t0 = time.monotonic()
        summary = stack.up(cfg)
        up_s = time.monotonic() - t0
        print(f"\n[slurm pods] pulumi up with rollout waits on 2 real nodes: {up_s:.1f}s ({summary})")
        pods = _pods(cfg)
        for p in pods:
            print(
                f"[slurm pods] {p['metadata']['name']} on {p['spec']['nodeName']}: Ready in {_start_seconds(p):.1f}s"
            )
        # waitForRollout held: everything is Ready the moment `pulumi up` returns
        assert all(_ready(p) for p in pods), [p["metadata"]["name"] for p in pods if not _ready(p)]
        # every pod of the stack runs, in every namespace: the XID watchers too (they read the
        # simulator's kernel logs; on the host's /dev/kmsg they crash-looped)
        try:
            wait_for(lambda: podreport.report(cfg.kubeconfig) == "", 60, "every pod Ready")
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{podreport.report(cfg.kubeconfig)}") from exc
        slurmd = {
            p["spec"]["nodeName"]: p["metadata"]["name"] for p in pods if "slurmd" in p["metadata"]["name"]
        }
        assert sorted(slurmd) == ["gpu-1", "gpu-2"]
        pvcs = _get(cfg, f"/api/v1/namespaces/{NS}/persistentvolumeclaims")["items"]
        assert {c["metadata"]["name"]: c["status"]["phase"] for c in pvcs} == {
            "slurm-home": "Bound",
            "slurm-checkpoints": "Bound",
            "state-slurmctld-0": "Bound",
        }

        login = Login(cfg)  # ssh to the login Service, its host key checked
        # the Slurm nodes are the Kubernetes nodes, found by themselves (dynamic nodes)
        assert login.run("sinfo -h -N -p h100 -o '%N %t'").split("\n")[:2] == [
            "gpu-1 idle",
            "gpu-2 idle",
        ]
        assert "JOBID" in login.run("squeue")
        t1 = time.monotonic()
        job = login.run("cat > job.sh && sbatch --parsable job.sh", stdin=JOB).strip()
        wait_for(
            lambda: _job_state(login, job) in ("COMPLETED", "FAILED", "CANCELLED"), 90, f"job {job} to end"
        )
        round_trip = time.monotonic() - t1
        assert _job_state(login, job) == "COMPLETED"
        print(f"[slurm pods] sbatch over ssh -> 2-node job COMPLETED: {round_trip:.1f}s")
        lines = sorted(login.run(f"cat job-{job}.out").split("\n")[:2])
        # each step ran inside a slurmd pod (its hostname), as that node, with the one GPU it got:
        # of the node's 4 device files it may open only that GPU's
        assert lines == sorted([f"{slurmd[n]} {n} 0 nvidia0 4" for n in ("gpu-1", "gpu-2")]), lines

        # a slurmd pod that stops takes its node out of Slurm; its successor joins by itself
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            r = http.delete(f"/api/v1/namespaces/{NS}/pods/{slurmd['gpu-1']}")
            assert r.status_code == 200, r.text
        wait_for(lambda: "gpu-1" not in login.run("sinfo -h -N -o %N"), 60, "gpu-1 to leave Slurm")
        t2 = time.monotonic()
        wait_for(
            lambda: any(
                _ready(p) and p["spec"]["nodeName"] == "gpu-1"
                for p in _pods(cfg)
                if "slurmd" in p["metadata"]["name"]
            ),
            120,
            "gpu-1's new slurmd pod Ready",
        )
        print(
            f"[slurm pods] a deleted slurmd pod's node left Slurm; its successor rejoined in {time.monotonic() - t2:.1f}s"
        )
        assert "gpu-1 idle" in login.run("sinfo -h -N -p h100 -o '%N %t'")

        # a pod that never becomes Ready is explained: pod, container, state and its last log lines
        _crashing_pod(cfg, next(c["image"] for c in pods[0]["spec"]["containers"]))
        # (between restarts a crashing container without a readiness probe is briefly Ready, and the
        # kubelet serves a run's log lines before its status sync reports that the run exited)
        last: list[str] = [""]

        def crash_report() -> str | None:
            last[0] = podreport.report(cfg.kubeconfig, ["default"])
            return last[0] if "boom: 3" in last[0] and "exit" in last[0] else None

        try:
            text = wait_for(crash_report, 90, "the crash report")
        except AssertionError as exc:
            with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
                pod = http.get("/api/v1/namespaces/default/pods/a-crash").json()
            raise AssertionError(f"{exc}; last report: {last[0]!r}; the pod: {pod.get('status')}") from exc
        assert "pod default/a-crash container c: " in text and "exit" in text, text
        assert "no such file /etc/slurm/missing.conf" in text, text
        assert "pod slurm/" not in text  # Ready pods are left out
    finally:
        labmod.down(cfg)


def _crashing_pod(cfg: LabConfig, image: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "a-crash"},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "c",
                    "image": image,
                    "command": [
                        "sh",
                        "-c",
                        "echo boom: 1; echo boom: 2; echo boom: 3; "
                        "echo no such file /etc/slurm/missing.conf; exit 3",
                    ],
                }
            ],
        },
    }
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.post("/api/v1/namespaces/default/pods", json=pod)
        assert r.status_code == 201, r.text
