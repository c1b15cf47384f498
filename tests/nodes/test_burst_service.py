"""The burst demo's inference service on real kubelets (lab/burst.py, issue 35), on the package's
two real nodes (4 GPUs each, no Slurm): the Deployment (its PriorityClass, 2 GPUs a replica) and
its NodePort Service, reached from this host; the load generator's requests and the demo's
autoscaler scaling the Deployment with the load. Each answer names the node and pod that served
it, and they are the pods' own; a scale-up beyond the free GPUs leaves a replica Pending (what
the lender lends a node for, in `autoheal lab demo --scenario burst`); the load gone, the
autoscaler scales to 0 and the requests fail again. Prints scale-up -> first request served."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from lab import burst
from tests.nodes.conftest import Cluster
from tests.support import wait_for

pytestmark = pytest.mark.timeout(600)


def _delete(c: Cluster, path: str) -> None:
    r = c.http.delete(path)
    assert r.status_code in (200, 202, 404), r.text


def test_the_inference_service_serves_and_scales_with_the_load(real_cluster: Cluster) -> None:
    c = real_cluster
    kube = burst.Kube(c.kubeconfig)
    load = burst.LoadGenerator("")
    try:
        port = kube.install(c.image("runner"), "h100")
        assert kube.install(c.image("runner"), "h100") == port  # a second install finds it there
        load.url = burst.node_url(c.run_dir, port)
        load.start()
        scaler = burst.Autoscaler(burst.PER_POD_RPS, max_replicas=5, down_after=1.0)

        def drive(rate: float, until: Callable[[], object], timeout: float, what: str) -> None:
            """The load at `rate`, the autoscaler following it, until `until()`."""
            load.rate = rate

            def step() -> object:
                want = scaler.decide(time.time(), rate)
                if want is not None:
                    kube.scale(want)
                return until()

            wait_for(step, timeout, what, interval=0.25)

        # nothing serves yet (0 replicas, no autoscaler yet): the requests fail
        t0 = time.time()
        load.rate = 5
        wait_for(lambda: len(load.since(t0)) >= 5, 30, "requests sent")
        assert not any(a.ok for a in load.since(t0))

        # the burst: 20 requests/s -> 2 replicas, each serving
        t_up = time.time()
        drive(20, lambda: len({a.pod for a in load.since(t_up) if a.ok}) == 2, 180, "2 replicas answering")
        assert scaler.replicas == 2
        pods = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in kube.pods()}
        served = [a for a in load.since(t_up) if a.ok]
        assert {(a.pod, a.node) for a in served} <= set(pods.items())  # each answer is its pod's own
        first = served[0]
        print(
            f"\n[burst service] scaled to 2 -> first request served: {first.ts - t_up:.1f}s (on {first.node})"
        )

        # beyond the free GPUs: 5 replicas x 2 GPUs on 2 nodes x 4 GPUs: 4 Running, 1 Pending
        def split() -> tuple[int, int] | None:
            phases = [p["status"].get("phase") for p in kube.pods()]
            got = (phases.count("Running"), phases.count("Pending"))
            return got if got == (4, 1) else None

        drive(50, split, 180, "4 replicas Running, 1 Pending for want of GPUs")
        assert scaler.replicas == 5
        pending = next(p for p in kube.pods() if p["status"].get("phase") == "Pending")
        why = " ".join(cond.get("message", "") for cond in pending["status"].get("conditions") or [])
        assert "nvidia.com/gpu" in why, why

        # the load gone: down to 0 after the stabilization, and once the pods have stopped (and
        # kube-proxy dropped their endpoints) the requests fail again
        drive(0, lambda: scaler.replicas == 0 and not kube.pods(), 120, "scaled to 0, pods deleted")
        t_gone = time.time()
        load.rate = 5

        def failing() -> bool:
            last = load.since(t_gone)[-5:]
            return len(last) == 5 and not any(a.ok for a in last)

        wait_for(failing, 60, "5 requests in a row failing after the scale-down")
    finally:
        load.stop()
        _delete(c, f"/apis/apps/v1/namespaces/{burst.NAMESPACE}/deployments/{burst.DEPLOYMENT}")
        _delete(c, f"/api/v1/namespaces/{burst.NAMESPACE}/services/{burst.SERVICE}")
        _delete(c, f"/apis/scheduling.k8s.io/v1/priorityclasses/{burst.PRIORITY_CLASS}")
        kube.close()

        # the package's next test finds the nodes' GPUs free: no replica left, not even stopping
        def gone() -> bool:
            r = c.http.get(
                f"/api/v1/namespaces/{burst.NAMESPACE}/pods", params={"labelSelector": "app=infer"}
            )
            return r.status_code == 200 and not r.json()["items"]

        wait_for(gone, 60, "the inference pods gone")
