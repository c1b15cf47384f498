"""Lending a Slurm node to an inference burst and taking it back, on real kubelets with Slurm in
pods (issue 35): `pulumi up` of the stack on two real nodes, a training job on one, an inference
Deployment (its own PriorityClass) asking for a whole node's GPUs -> its pod Pending -> the lender
(remediation/lender.py, as the leading runner runs it) lends the idle node: drained in Slurm with
autoheal's reason, its slurmd pod gone (the DaemonSet's affinity), its Slurm record gone -> the
inference pod Running there; the Deployment scaled to 0 -> after the idle time and the cooldown the
node comes back: slurmd Running, the node idle in Slurm, a training job runs there. Then a second
burst with both nodes busy: the lower-priority job's node is lent, that job requeued past the grace
(the other left alone), and once the burst ends it runs on the returned node again.

Last (it retires a node), an XID on a lent node (deliver 2): the inference pod on it, the runbook
(gpu_fatal_xid.yml through the runner's Executor, as tests/k8s_slurm/test_slurm_rollout.py runs it)
fences, cordons, drains and retires the node though Slurm has no record of it; the lender, running
all along, leaves the fenced node alone and lends the other node to the evicted pod, which runs
there; the evicted pod, its Deployment and the owner's contact are in the journal and the
notifications; a second run changes nothing.

The lend's first step is made by one Lender and finished by a new one (a runner restarting
mid-lend picks up from the Node's label). The lender's Slurm commands reach slurmctld through
`kubectl exec` (tests/k8s_slurm/test_slurm_rollout.py's wrappers). Prints the times: Pending ->
inference pod Running (idle node, and busy node with its job requeued), scale-down -> node back in
Slurm; XID on the lent node -> inference Running on the next node lent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import (
    LEND_LABEL,
    LEND_MOVED_ANNOTATION,
    LEND_REASON,
    OPT_OUT_LABEL,
    OWNER_CONTACT_ANNOTATION,
    QUARANTINE_TAINT_KEY,
    QUARANTINED,
    STATE_LABEL,
)
from lab import controlplane, pool, stack
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.login import Login
from remediation.cordon_sync import SyncJournal
from remediation.executor import Executor, read_events
from remediation.lender import KubeLending, Lender, SlurmLending
from remediation.lending import Policy
from remediation.states import RunStatus
from tests.k8s_slurm import test_slurm_rollout as rollout
from tests.k8s_slurm.test_slurm_pods import _job_state, _pods, _ready
from tests.k8s_slurm.test_slurm_rollout import _slurm_bin
from tests.nodes.conftest import require_real_nodes
from tests.runbook.conftest import REPO, Sink
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(1500)
PC = "inference"
POLICY = Policy(
    max_nodes=1, max_percent=50, min_training=1, cooldown=20, return_after=10, grace=15, on_grace="requeue"
)


CONTACT = "email:serving@example.org"


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
                # the service's owner, told when the runbook evicts its pods (k8s_evict reads the pod)
                "metadata": {"labels": labels, "annotations": {OWNER_CONTACT_ANNOTATION: CONTACT}},
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


class LendLab:
    def __init__(self, cfg: LabConfig, login: Login, bin_dir: Path) -> None:
        self.cfg, self.login, self.bin_dir = cfg, login, bin_dir


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LendLab]:
    """Two real nodes with Slurm in pods (pulumi up of the stack); the lender's Slurm commands
    reach slurmctld through the wrappers in `bin_dir` (put first on PATH by each test)."""
    require_real_nodes()
    if not stack.available():
        pytest.skip("LENDING NOT TESTED: pulumi or its Kubernetes provider is not built")
    if shutil.which("ssh") is None:
        pytest.skip("LENDING NOT TESTED: the ssh client is not installed")
    tmp = tmp_path_factory.mktemp("k8slend")
    cfg = LabConfig(
        name="a-k8slend",
        root=tmp / "labs",
        port_base=port_base(23400),
        pools=[PoolConfig(size=2, spares=0, headroom=1, gpus_per_node=4)],
        real_nodes=2,
        runner=False,
        watchers=False,
    )
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        stack.up(cfg)
        print(f"\n[lending] lab and pulumi up on 2 real nodes: {time.monotonic() - t0:.1f}s")
        yield LendLab(cfg, Login(cfg), _slurm_bin(cfg, tmp / "bin"))
    finally:
        labmod.down(cfg)


def _lender(
    cfg: LabConfig, journal: SyncJournal, notes: list[dict[str, Any]], policy: Policy = POLICY
) -> Lender:
    """The lender as the leading runner runs it, every second, its notifications into `notes`."""
    return Lender(
        KubeLending(cfg.kubeconfig),
        SlurmLending(None),
        journal,
        policy,
        PC,
        OPT_OUT_LABEL,
        interval=1.0,
        notify=lambda event, **f: notes.append({"event": event, **f}),
    )


def test_an_idle_node_is_lent_to_an_inference_burst_and_comes_back_to_slurm(
    lab: LendLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, login = lab.cfg, lab.login
    lenders: list[Lender] = []
    try:
        monkeypatch.setenv("PATH", f"{lab.bin_dir}:{os.environ['PATH']}")
        journal = SyncJournal(tmp_path / "lending.jsonl")
        notes: list[dict[str, Any]] = []

        def lender() -> Lender:
            return _lender(cfg, journal, notes)

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


# -- an XID on a lent node (issue 35, deliver 2) ------------------------------------------------

# The pool has two nodes and the XID fences one: the next lend takes the last training node (a
# fenced node counts on neither side of the limits; production keeps min_training >= 1).
XID_POLICY = replace(POLICY, max_percent=100, min_training=0)


def _squeue_ids() -> list[str]:
    res = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def _ensure_inference(cfg: LabConfig) -> None:
    """The PriorityClass and the Deployment at 0 replicas (made here when this test runs alone)."""
    pod = next(p for p in _pods(cfg) if "slurmd" in p["metadata"]["name"])
    dep = _deployment(pod["spec"]["containers"][0]["image"], 4)
    dep["spec"]["replicas"] = 0
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        r = http.post("/apis/scheduling.k8s.io/v1/priorityclasses", json=PRIORITY_CLASS)
        assert r.status_code in (201, 409), r.text
        r = http.post("/apis/apps/v1/namespaces/default/deployments", json=dep)
        assert r.status_code in (201, 409), r.text
    _scale(cfg, 0)


def _running_on(cfg: LabConfig, node: str) -> Callable[[], dict[str, Any] | None]:
    return lambda: next(
        (
            p
            for p in _infer_pods(cfg)
            if p["status"].get("phase") == "Running" and p["spec"]["nodeName"] == node
        ),
        None,
    )


def _cooled(cfg: LabConfig, node: str) -> None:
    """Wait out the node's lending cooldown (a node lent by the test before is held that long)."""
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        moved = (
            http.get(f"/api/v1/nodes/{node}")
            .json()["metadata"]
            .get("annotations", {})
            .get(LEND_MOVED_ANNOTATION)
        )
    if moved:
        time.sleep(max(0.0, float(moved) + XID_POLICY.cooldown + 1 - time.time()))


def test_an_xid_on_a_lent_node_fences_and_retires_it_and_its_inference_pod_runs_on_the_next_node_lent(
    lab: LendLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lent node serving an inference pod gets an XID 79: the runbook, run as the runner runs it,
    fences (cordon, quarantine taint and label), drains (the inference pod evicted) and retires it
    though Slurm has no record of it ("not in Slurm: lent to inference", no Slurm step fails, no
    spare asked for); the owners are told which pod of which Deployment, with the contact its pod
    template gives. The lender, running all along, never returns, uncordons or relabels the fenced
    node, and its GPUs are not counted free: the evicted pod, Pending again, lends the other node,
    where it runs. A second run changes nothing."""
    cfg, login = lab.cfg, lab.login
    monkeypatch.setenv("PATH", f"{lab.bin_dir}:{os.environ['PATH']}")
    # the node slurmctld's pod is not on is the one to fail (a drain would move slurmctld)
    keep = next(p["spec"]["nodeName"] for p in _pods(cfg) if p["metadata"]["name"] == "slurmctld-0")
    victim = "gpu-2" if keep == "gpu-1" else "gpu-1"
    for job in _squeue_ids():  # a clean slate after the tests before
        subprocess.run(["scancel", job], capture_output=True, timeout=60, check=False)
    _ensure_inference(cfg)
    wait_for(lambda: not _infer_pods(cfg), 60, "no inference pod")
    assert LEND_LABEL not in _node_labels(cfg, victim) and LEND_LABEL not in _node_labels(cfg, keep)
    _cooled(cfg, victim)
    # the other node busy: the idle victim is the one lent
    hold = login.run(f"sbatch --parsable -w {keep} --gres=gpu:h100:1 --wrap 'sleep 600'").strip()
    wait_for(lambda: _job_state(login, hold) == "RUNNING", 60, f"job {hold} running on {keep}")

    journal = SyncJournal(tmp_path / "lending.jsonl")
    notes: list[dict[str, Any]] = []
    lender = _lender(cfg, journal, notes, XID_POLICY)
    sink = Sink(port_base(23600))
    try:
        lender.start()
        t0 = time.monotonic()
        _scale(cfg, 1)
        served = wait_for(_running_on(cfg, victim), 180, f"the inference pod Running on {victim}")
        assert _node_labels(cfg, victim)[LEND_LABEL] == "lent"
        print(f"\n[lend-xid] {victim} lent, inference Running: {time.monotonic() - t0:.1f}s")
        subprocess.run(["scancel", hold], capture_output=True, timeout=60, check=True)

        # the lab runner's play vars, and the webhook the owners hear on
        extra = rollout._xid_play_vars(cfg, tmp_path, autoheal_webhook_url=sink.url)
        ex = Executor(REPO / "playbooks", tmp_path / "runner", step_timeout=900, run_timeout=1800)
        rlab = rollout.Lab(cfg, lab.bin_dir, login)
        # what a drain evicts there: the inference pod, and any Slurm pod the scheduler put there
        to_evict = rollout._pods_on(cfg, victim)
        print(f"[lend-xid] pods a drain evicts from {victim}: {to_evict}")
        outcome, run, took = rollout._run_xid_79(rlab, ex, 1, victim, extra)
        assert outcome.status is RunStatus.SUCCESSFUL and outcome.rc == 0, (
            outcome,
            rollout._play_output(ex, 1),
        )
        events, _ = read_events(ex.events_path(1), 0, {rollout.XID_INCIDENT: victim})
        t_fault = min(e.ts for e in events)
        print(
            f"[lend-xid] run 1: {took:.1f}s; "
            + ", ".join(f"{e.phase} +{e.ts - t_fault:.1f}s" for e in events)
        )
        by = {e.phase: e for e in events}
        assert not [e for e in events if e.status == "failed"], events
        assert {"fenced", "drained", "retired", "done"} <= set(by), events
        # no Slurm step for a node Slurm does not know: no jobs, no spare
        assert not {"jobs_signalled", "requeued", "spare_promoted", "no_spare"} & set(by), events
        assert by["fenced"].detail == f"not in Slurm: lent to inference ({LEND_LABEL}=lent)", by["fenced"]
        pod_key = f"default/{served['metadata']['name']}"
        assert pod_key in to_evict
        assert f"{pod_key} (Deployment default/infer, owner {CONTACT})" in by["drained"].detail, by["drained"]

        # after the drain, before the retire: fenced, empty, still labelled lent (the lender held off)
        seen = run.after_drain
        assert seen and "error" not in seen, seen
        spec, meta = seen["kube"]["spec"], seen["kube"]["metadata"]
        assert spec.get("unschedulable") is True
        assert any(t["key"] == QUARANTINE_TAINT_KEY for t in spec.get("taints") or [])
        assert meta["labels"].get(STATE_LABEL) == QUARANTINED and meta["labels"].get(LEND_LABEL) == "lent"
        assert seen["pods"] == [] and seen["slurm"] == ""

        # the owners told: which pod of which Deployment, and whom to reach
        bodies = {b.get("event"): b for b in sink.bodies}
        want = {
            "pod": pod_key,
            "namespace": "default",
            "kind": "Deployment",
            "name": "infer",
            "contact": CONTACT,
        }
        told = bodies["pods_evicted"]["evicted"]
        assert list(told) == [victim] and want in told[victim], sink.bodies
        assert sorted(r["pod"] for r in told[victim]) == to_evict
        assert bodies["done"]["evicted"] == told
        assert [e for e in sink.events() if e == "pods_evicted"] == ["pods_evicted"]

        # rescheduled: the Deployment's new pod Pending -> the lender lends the other node -> Running
        moved = wait_for(_running_on(cfg, keep), 180, f"the inference pod Running on {keep}")
        assert moved["metadata"]["name"] != served["metadata"]["name"]
        rows = [json.loads(x) for x in journal.path.read_text().splitlines()]
        assert [(r["node"], r["action"]) for r in rows] == [
            (victim, "lend"),
            (victim, "lent"),
            (keep, "lend"),
            (keep, "lent"),
        ], rows
        started = max(
            datetime.fromisoformat(c["state"]["running"]["startedAt"].replace("Z", "+00:00")).timestamp()
            for c in moved["status"]["containerStatuses"]
        )
        print(
            f"[lend-xid] from the fence: {keep} lend +{rows[2]['ts'] - t_fault:.1f}s, lent"
            f" +{rows[3]['ts'] - t_fault:.1f}s, the new inference pod Running there +{started - t_fault:.1f}s"
            f" (the node retired +{by['retired'].ts - t_fault:.1f}s)"
        )
        assert [n["event"] for n in notes] == ["lending.lend", "lending.lent"] * 2

        # retired through the pool backend: the Node and its lend label are gone with it
        assert victim in pool.client_status(cfg)["retired"]
        with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
            assert http.get(f"/api/v1/nodes/{victim}").status_code == 404

        # the same run again: every step finds its work done, no owner told twice
        sent = len(sink.bodies)
        outcome, again, took = rollout._run_xid_79(rlab, ex, 2, victim, extra)
        assert outcome.status is RunStatus.SUCCESSFUL and outcome.rc == 0, (
            outcome,
            rollout._play_output(ex, 2),
        )
        changed = [s for s in again.steps if s[2]]
        print(f"[lend-xid] run 2: {took:.1f}s, {len(again.steps)} steps, changed {len(changed)}")
        assert changed == [], changed
        assert "pods_evicted" not in [b.get("event") for b in sink.bodies[sent:]]
        assert [(r["node"], r["action"]) for r in map(json.loads, journal.path.read_text().splitlines())][
            4:
        ] == []
    finally:
        lender.stop()
        sink.stop()
