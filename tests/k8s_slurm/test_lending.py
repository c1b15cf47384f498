"""Lending a Slurm node to an inference burst and taking it back, on real kubelets with Slurm in
pods (issue 35): `pulumi up` of the stack on two real nodes, a training job on one, an inference
Deployment (its own PriorityClass) asking for a whole node's GPUs -> its pod Pending -> the lender
(remediation/lender.py, as the leading runner runs it) lends the idle node: drained in Slurm with
autoheal's reason, its slurmd pod gone (the DaemonSet's affinity), its Slurm record gone -> the
inference pod Running there; the Deployment scaled to 0 -> after the idle time and the cooldown the
node comes back: slurmd Running, the node idle in Slurm, a training job runs there. Then a second
burst with both nodes busy: the lower-priority job's node is lent, that job requeued past the grace
(the other left alone), and once the burst ends it runs on the returned node again.

The lend's first step is made by one Lender and finished by a new one (a runner restarting
mid-lend picks up from the Node's label). The lender's Slurm commands reach slurmctld through
`kubectl exec` (tests/k8s_slurm/test_slurm_rollout.py's wrappers). Prints the times: Pending ->
inference pod Running (idle node, and busy node with its job requeued), scale-down -> node back in
Slurm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import LEND_LABEL, LEND_MOVED_ANNOTATION, LEND_REASON, OPT_OUT_LABEL
from lab import controlplane, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from remediation.cordon_sync import SyncJournal
from remediation.lender import KubeLending, Lender, SlurmLending
from remediation.lending import Policy
from tests.k8s_slurm.test_slurm_pods import _job_state, _pods, _ready
from tests.k8s_slurm.test_slurm_rollout import _slurm_bin
from tests.nodes.conftest import require_real_nodes
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(1500)
PC = "inference"
POLICY = Policy(
    max_nodes=1, max_percent=50, min_training=1, cooldown=20, return_after=10, grace=15, on_grace="requeue"
)


def _deployment(image: str, gpus: int) -> dict[str, Any]:
    labels = {"app": "infer"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": PC,
                    "nodeSelector": {"autoheal.io/pool": "h100"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "serve",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sleep", "infinity"],
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


# The inference class never preempts: without preemptionPolicy Never the scheduler would evict a
# slurmd pod (priority 0) under its running jobs to place an inference pod, lender or not.
PRIORITY_CLASS = {
    "apiVersion": "scheduling.k8s.io/v1",
    "kind": "PriorityClass",
    "metadata": {"name": PC},
    "value": 1000,
    "preemptionPolicy": "Never",
}


def _infer_pods(cfg: LabConfig) -> list[dict[str, Any]]:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get("/api/v1/namespaces/default/pods", params={"labelSelector": "app=infer"})
        r.raise_for_status()
        return [p for p in r.json()["items"] if not p["metadata"].get("deletionTimestamp")]


def _slurmd_on(cfg: LabConfig, node: str) -> dict[str, Any] | None:
    return next(
        (p for p in _pods(cfg) if "slurmd" in p["metadata"]["name"] and p["spec"].get("nodeName") == node),
        None,
    )


def _scontrol(*argv: str) -> None:
    """scontrol as a Slurm operator (the wrappers on PATH run it in the slurmctld pod)."""
    res = subprocess.run(["scontrol", *argv], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


def _node_labels(cfg: LabConfig, node: str) -> dict[str, str]:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.get(f"/api/v1/nodes/{node}")
        r.raise_for_status()
        labels: dict[str, str] = r.json()["metadata"].get("labels") or {}
        return labels


def _scale(cfg: LabConfig, replicas: int) -> None:
    """The inference Deployment to `replicas` (the burst starts or ends)."""
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.patch(
            "/apis/apps/v1/namespaces/default/deployments/infer",
            content=json.dumps({"spec": {"replicas": replicas}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert r.status_code == 200, r.text


def test_an_idle_node_is_lent_to_an_inference_burst_and_comes_back_to_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_real_nodes()
    if not stack.available():
        pytest.skip("LENDING NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None:
        pytest.skip("LENDING NOT TESTED: the ssh client is not installed")
    cfg = LabConfig(
        name="a-k8slend",
        root=tmp_path,
        port_base=port_base(23400),
        pools=[PoolConfig(size=2, spares=0, headroom=1, gpus_per_node=4)],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    lenders: list[Lender] = []
    try:
        labmod.up(cfg)
        stack.up(cfg)
        login = Login(cfg)
        monkeypatch.setenv("PATH", f"{_slurm_bin(cfg, tmp_path / 'bin')}:{os.environ['PATH']}")
        journal = SyncJournal(tmp_path / "lending.jsonl")

        def lender() -> Lender:
            return Lender(
                KubeLending(cfg.kubeconfig),
                SlurmLending(None),
                journal,
                POLICY,
                PC,
                OPT_OUT_LABEL,
                interval=1.0,
                notify=lambda event, **f: notes.append({"event": event, **f}),
            )

        notes: list[dict[str, Any]] = []
        # training: a job holds gpu-1, gpu-2 is idle
        busy = login.run("sbatch --parsable -w gpu-1 --gres=gpu:h100:1 --wrap 'sleep 600'").strip()
        wait_for(lambda: _job_state(login, busy) == "RUNNING", 60, f"job {busy} running on gpu-1")

        image = next(c["image"] for c in _slurmd_on(cfg, "gpu-2")["spec"]["containers"])
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            r = http.post("/apis/scheduling.k8s.io/v1/priorityclasses", json=PRIORITY_CLASS)
            assert r.status_code == 201, r.text
            r = http.post("/apis/apps/v1/namespaces/default/deployments", json=_deployment(image, 4))
            assert r.status_code == 201, r.text
        t_burst = time.monotonic()
        wait_for(
            lambda: any(p["status"].get("phase") == "Pending" for p in _infer_pods(cfg)),
            30,
            "inference Pending",
        )
        time.sleep(3)  # no GPU free: it stays Pending
        assert [p["status"]["phase"] for p in _infer_pods(cfg)] == ["Pending"]

        # one pass: gpu-2 (idle) is lent's first step: labelled lending, drained with our reason
        first = lender()
        done = [(m.node, m.verb) for m in first.reconcile().moves]
        assert done == [("gpu-2", "lend")], done
        assert _node_labels(cfg, "gpu-2")[LEND_LABEL] == "lending"
        shown = login.run("scontrol show node gpu-2")
        assert "DRAIN" in shown and f"Reason={LEND_REASON}" in shown, shown
        # ... and a new runner finishes the lend from the Node's label
        second = lender()
        lenders.append(second)
        second.start()
        pod = wait_for(
            lambda: next((p for p in _infer_pods(cfg) if p["status"].get("phase") == "Running"), None),
            180,
            "the inference pod Running",
        )
        to_running = time.monotonic() - t_burst
        assert pod["spec"]["nodeName"] == "gpu-2"
        assert _node_labels(cfg, "gpu-2")[LEND_LABEL] == "lent"
        assert _slurmd_on(cfg, "gpu-2") is None  # the DaemonSet's affinity took slurmd off
        assert "gpu-2" not in login.run("sinfo -h -N -o %N")  # its SIGTERM trap deleted the node
        assert _job_state(login, busy) == "RUNNING"  # the busy node was never taken
        assert _slurmd_on(cfg, "gpu-1") is not None
        print(f"\n[lending] inference pod Pending -> Running on the lent node: {to_running:.1f}s")

        # the burst ends: after the idle time and the cooldown the node goes back to Slurm
        _scale(cfg, 0)
        t_quiet = time.monotonic()

        def back() -> bool:
            pod = _slurmd_on(cfg, "gpu-2")
            return pod is not None and _ready(pod) and "gpu-2 idle" in login.run("sinfo -h -N -o '%N %t'")

        wait_for(back, 240, "gpu-2 back in Slurm, idle")
        to_back = time.monotonic() - t_quiet
        print(f"[lending] Deployment scaled to 0 -> node back in Slurm (slurmd Ready, idle): {to_back:.1f}s")
        labels = _node_labels(cfg, "gpu-2")
        assert LEND_LABEL not in labels
        job = login.run("sbatch --parsable -w gpu-2 --gres=gpu:h100:1 --wrap 'hostname'").strip()
        wait_for(lambda: _job_state(login, job) in ("COMPLETED", "FAILED", "CANCELLED"), 90, f"job {job}")
        assert _job_state(login, job) == "COMPLETED"

        rows = [json.loads(x) for x in journal.path.read_text().splitlines()]
        assert [(r["node"], r["action"]) for r in rows] == [
            ("gpu-2", "lend"),
            ("gpu-2", "lent"),
            ("gpu-2", "return"),
            ("gpu-2", "returned"),
        ], rows
        assert [n["event"] for n in notes] == [
            "lending.lend",
            "lending.lent",
            "lending.return",
            "lending.returned",
        ]
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            events = http.get(
                "/api/v1/namespaces/default/events", params={"fieldSelector": "involvedObject.name=gpu-2"}
            ).json()["items"]
        reasons = [e["reason"] for e in events if e.get("source", {}).get("component") == "autoheal-lender"]
        assert sorted(reasons) == sorted(
            ["LendingToInference", "LentToInference", "ReturningToTraining", "ReturnedToTraining"]
        )
        # a second burst with both nodes busy: the lower-priority job's node is lent, its job
        # requeued past the grace (SIGTERM, back in the queue), and it runs there again after
        low = login.run("sbatch --parsable --requeue -w gpu-2 --gres=gpu:h100:1 --wrap 'sleep 600'").strip()
        wait_for(lambda: _job_state(login, low) == "RUNNING", 60, f"job {low} running on gpu-2")
        _scontrol("update", f"jobid={busy}", "priority=5000")
        _scontrol("update", f"jobid={low}", "priority=10")
        # gpu-2 out of its cooldown first (else gpu-1 would be the only candidate)
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            moved = float(
                http.get("/api/v1/nodes/gpu-2").json()["metadata"]["annotations"][LEND_MOVED_ANNOTATION]
            )
        time.sleep(max(0.0, moved + POLICY.cooldown + 1 - time.time()))
        _scale(cfg, 1)
        t_burst2 = time.monotonic()
        pod = wait_for(
            lambda: next((p for p in _infer_pods(cfg) if p["status"].get("phase") == "Running"), None),
            240,
            "the inference pod Running again",
        )
        assert pod["spec"]["nodeName"] == "gpu-2"
        print(
            f"[lending] busy node: burst -> inference Running after the requeue: {time.monotonic() - t_burst2:.1f}s"
        )
        shown = login.run(f"scontrol show job {low}")
        assert "JobState=PENDING" in shown and "Restarts=1" in shown, shown
        assert _job_state(login, busy) == "RUNNING"  # the higher-priority job was left alone
        _scale(cfg, 0)
        wait_for(
            lambda: _job_state(login, low) == "RUNNING", 240, f"requeued job {low} running on gpu-2 again"
        )
        rows = [json.loads(x) for x in journal.path.read_text().splitlines()]
        assert [r["action"] for r in rows[4:]] == ["lend", "requeue", "lent", "return", "returned"], rows
        second.stop()
        assert second._thread is not None
        second._thread.join(15)
        assert first.reconcile().moves == []  # a pass after: nothing
    finally:
        for x in lenders:
            x.stop()
        labmod.down(cfg)
