"""What a pods lab's cloud does to a real node's pods: a graceful shutdown, a reboot, and waiting
for the node's slurmd pod, which is how a node joins Slurm when Slurm runs as pods.

In a host lab the pool controller starts and stops slurmd processes itself; in a pods lab slurmd
is the SlurmCluster DaemonSet's pod on the node, so the controller only acts on the node (as a
cloud acts on an instance) and watches that pod through the API server.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx

from autoheal.errors import LabError
from lab import controlplane, procs
from lab.config import LabConfig

SLURM_NAMESPACE = "slurm"  # the stack's SlurmCluster namespace (Pulumi.lab.yaml: the default)
SLURMD_COMPONENT = "slurmd"  # app.kubernetes.io/component of the slurmd pods


def _pods_on(http: httpx.Client, node: str, selector: str = "") -> list[dict[str, Any]]:
    params = {"fieldSelector": f"spec.nodeName={node}"}
    if selector:
        params["labelSelector"] = selector
    r = http.get("/api/v1/pods", params=params)
    r.raise_for_status()
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def shut_down(cfg: LabConfig, node: str, timeout: float | None = None) -> int:
    """Delete every pod bound to `node` with its own grace period (a cloud's graceful shutdown:
    the kubelet gives each its preStop and grace) and wait until they are gone or `timeout`
    (default: the grace period + 30 s) passes; returns how many were deleted. A pod the kubelet
    does not end in time stops with the node, as it would on a real instance."""
    wait = timeout if timeout is not None else cfg.grace_seconds + 30.0
    with controlplane.http_client(cfg.kubeconfig, pool=4) as http:
        pods = _pods_on(http, node)
        for pod in pods:
            meta = pod["metadata"]
            r = http.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
            if r.status_code not in (200, 202, 404):
                raise LabError(
                    f"shutdown of {node}: deleting pod {meta['name']}: {r.status_code} {r.text[:200]}"
                )
        deadline = time.monotonic() + wait
        while _pods_on(http, node) and time.monotonic() < deadline:
            time.sleep(0.5)
    return len(pods)


def _started_after(pod: dict[str, Any], since: float) -> bool:
    """Every container of the pod (re)started at or after `since` (epoch seconds)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for c in statuses:
        started = ((c.get("state") or {}).get("running") or {}).get("startedAt")
        if not started or datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp() < since - 1:
            return False
    return bool(statuses)


def slurmd_ready(http: httpx.Client, node: str, since: float = 0.0) -> bool:
    """The node's slurmd pod is Ready (slurmctld knows its node), started after `since`."""
    for pod in _pods_on(http, node, f"app.kubernetes.io/component={SLURMD_COMPONENT}"):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
        if conds.get("Ready") == "True" and (not since or _started_after(pod, since)):
            return True
    return False


def slurmd_daemonset_exists(http: httpx.Client) -> bool:
    r = http.get(
        f"/apis/apps/v1/namespaces/{SLURM_NAMESPACE}/daemonsets",
        params={"labelSelector": f"app.kubernetes.io/component={SLURMD_COMPONENT}"},
    )
    return r.status_code == 200 and bool(r.json()["items"])


def wait_slurmd_ready(cfg: LabConfig, nodes: Sequence[str], timeout: float, since: float = 0.0) -> None:
    """Wait until each node runs a Ready slurmd pod (started after `since`). Nothing to wait for
    before the stack declared the slurmd DaemonSet (a lab whose `pulumi up` has not run yet)."""
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        if not slurmd_daemonset_exists(http):
            return
        left = list(nodes)

        def done() -> bool:
            left[:] = [n for n in left if not slurmd_ready(http, n, since)]
            return not left

        try:
            procs.wait_until(done, timeout, f"slurmd pods Ready on {', '.join(nodes)}", interval=0.5)
        except LabError as exc:
            raise LabError(f"{exc}; still not Ready: {', '.join(left)}") from None


def reboot(cfg: LabConfig, nodes: Sequence[str], timeout: float) -> dict[str, LabError | None]:
    """Reboot real nodes the way a cloud's reboot API does: each node's kubelet, containerd and
    pods stop at once (no graceful shutdown: the Slurm node keeps the state and reason the runbook
    gave it), the node starts again with the same name and address, re-registers with its Node
    object (labels and taints kept), and its slurmd pod starts and registers again. Returns
    {node: None if it came back within `timeout`, else the error}."""
    from lab.nodes import cluster

    t0 = time.time()
    out: dict[str, LabError | None] = {}

    def one(node: str) -> None:
        try:
            cluster.restart(cfg.run_dir, node, timeout=timeout)
            out[node] = None
        except LabError as exc:
            out[node] = exc

    with ThreadPoolExecutor(max(1, min(4, len(nodes)))) as pool:
        list(pool.map(one, nodes))
    back = [n for n in nodes if out[n] is None]
    if back:
        left = max(5.0, timeout - (time.time() - t0))
        try:
            wait_slurmd_ready(cfg, back, left, since=t0)
        except LabError as exc:
            with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
                for n in back:
                    if not slurmd_ready(http, n, since=t0):
                        out[n] = exc
    return out
