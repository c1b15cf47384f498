"""The Kubernetes API server away during a drain (issue 17, Deliver 3).

A real control plane (etcd, kube-apiserver, scheduler, controller manager, KWOK nodes); the drain is
the runbook's own module (autoheal.cluster.k8s_evict) run by Ansible. The API server is stopped while
the drain is under way and started again: the module waits for it (api_wait, growing pause) and the
drain completes; when it stays away longer than api_wait the step fails, naming the option, and the
node stays cordoned with its pods (fail closed: the play escalates, a human is paged).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lab import controlplane, procs
from tests.runbook.conftest import run_module
from tests.support import pinned_deployment, port_base, wait_for

pytestmark = pytest.mark.timeout(300)
PORT_BASE = port_base(24200)
NS = "default"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.KubeHandle]:
    if not (Path.home() / ".cache/autoheal/bin/kube-apiserver").exists():
        pytest.skip("the Kubernetes control plane is not built (scripts/build-tools.sh)")
    run_dir = tmp_path_factory.mktemp("apiserver-outage")
    try:
        yield controlplane.start_control_plane(
            run_dir,
            [controlplane.KubeNodeSpec("gpu-a"), controlplane.KubeNodeSpec("gpu-b")],
            PORT_BASE,
            timeout=120,
        )
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture
def api(plane: controlplane.KubeHandle) -> Iterator[httpx.Client]:
    with controlplane.http_client(plane.kubeconfig) as http:
        yield http


def _running(api: httpx.Client, app: str, node: str) -> list[str]:
    items = api.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": f"app={app}"}).json()["items"]
    return [
        p["metadata"]["name"]
        for p in items
        if p["spec"].get("nodeName") == node
        and not p["metadata"].get("deletionTimestamp")
        and p.get("status", {}).get("phase") == "Running"
    ]


def _cordon(api: httpx.Client, node: str, on: bool) -> None:
    api.patch(
        f"/api/v1/nodes/{node}",
        json={"spec": {"unschedulable": on}},
        headers={"Content-Type": "application/merge-patch+json"},
    ).raise_for_status()


def _unschedulable(api: httpx.Client, node: str) -> bool:
    return bool(api.get(f"/api/v1/nodes/{node}").json()["spec"].get("unschedulable"))


def _refused_evictions(run_dir: Path) -> int:
    """Evictions the API server answered 429 (a PodDisruptionBudget said not now)."""
    return sum(
        1
        for e in controlplane.audit_log(run_dir)
        if (e.get("objectRef") or {}).get("subresource") == "eviction"
        and (e.get("responseStatus") or {}).get("code") == 429
    )


def _evict(plane: controlplane.KubeHandle, node: str, **extra: Any) -> dict[str, Any]:
    args = {"nodes": [node], "kubeconfig": str(plane.kubeconfig), "grace_period": 0, "poll": 0.5, **extra}
    return run_module("k8s_evict", args)


def test_the_api_server_restarted_during_a_drain_the_drain_waits_and_completes(plane, api):
    """The drain is held open by a PodDisruptionBudget (as a real one would while a replica
    elsewhere starts), the API server goes away for 8 s, comes back, the budget is lifted: the
    same module run drains the node."""
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer", "namespace": NS},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "trainer"}}},
    }
    api.post(
        f"/apis/apps/v1/namespaces/{NS}/deployments", json=pinned_deployment("trainer", "gpu-a", 2, NS)
    ).raise_for_status()
    api.post(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", json=pdb).raise_for_status()
    try:
        wait_for(lambda: len(_running(api, "trainer", "gpu-a")) == 2, 90, "two pods running on gpu-a")
        wait_for(
            lambda: (
                api.get(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/trainer")
                .json()
                .get("status", {})
                .get("currentHealthy")
                == 2
            ),
            60,
            "the budget to count its pods",
        )
        _cordon(api, "gpu-a", True)
        refused_before = _refused_evictions(plane.run_dir)
        result: dict[str, Any] = {}
        drain = threading.Thread(
            target=lambda: result.update(_evict(plane, "gpu-a", timeout=120)), daemon=True
        )
        drain.start()
        wait_for(
            lambda: _refused_evictions(plane.run_dir) > refused_before,
            60,
            "the drain's first refused eviction",
        )

        t0 = time.monotonic()
        controlplane.restart_service(plane, "kube-apiserver", down_for=8.0)
        down = time.monotonic() - t0
        assert drain.is_alive(), f"the drain ended while the API server was away: {result}"
        api.delete(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/trainer").raise_for_status()
        drain.join(120)
        assert not drain.is_alive(), "the drain did not end after the API server came back"
    finally:
        api.delete(f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets/trainer")
        api.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/trainer")
        _cordon(api, "gpu-a", False)

    assert not result["failed"], result
    assert result["drained_nodes"] == ["gpu-a"] and result["not_evicted"] == {}, result
    assert len(result["evicted"]["gpu-a"]) == 2, result
    assert result["api_retries"] >= 1, (
        f"the API server was away {down:.1f}s and nothing was retried: {result}"
    )


def test_the_api_server_away_longer_than_api_wait_fails_the_step_and_the_node_stays_cordoned(plane, api):
    api.post(
        f"/apis/apps/v1/namespaces/{NS}/deployments", json=pinned_deployment("held", "gpu-b", 1, NS)
    ).raise_for_status()
    try:
        wait_for(lambda: _running(api, "held", "gpu-b"), 90, "a pod running on gpu-b")
        _cordon(api, "gpu-b", True)
        assert procs.stop(plane.run_dir, "kube-apiserver")
        t0 = time.monotonic()
        try:
            res = _evict(plane, "gpu-b", timeout=30, api_wait=3)
        finally:
            took = time.monotonic() - t0
            controlplane.restart_service(plane, "kube-apiserver")
        assert res["failed"], res
        assert "api_wait=3s" in res["msg"] and "raise api_wait" in res["msg"], res["msg"]
        # it tried again (0.5 s, then 1 s later) and gave up when the next pause (2 s) would pass
        # api_wait: at least 1.5 s of waiting, never the whole step timeout
        assert res["api_retries"] >= 2 and 1.5 <= took < 30, (took, res)
        # nothing was done: the node is still cordoned and its pod still runs there
        assert _unschedulable(api, "gpu-b")
        assert _running(api, "held", "gpu-b")
    finally:
        api.delete(f"/apis/apps/v1/namespaces/{NS}/deployments/held")
        _cordon(api, "gpu-b", False)
