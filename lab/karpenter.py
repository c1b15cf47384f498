"""Karpenter, the real controller, on a lab control plane: its KWOK cloud provider launches nodes.

Karpenter's `kwok` provider (sigs.k8s.io/karpenter/kwok, built by scripts/build-tools.sh as
`karpenter-kwok`) "launches an instance" by creating a Node annotated `kwok.x-k8s.io/node=fake`,
the annotation the lab's KWOK already manages (lab/controlplane.py): KWOK's node-initialize stage
makes it Ready, Karpenter registers it (removes its `karpenter.sh/unregistered` taint, puts the
NodeClaim's labels and taints on it) and initializes it. So NodePools, NodeClaims, static capacity
and replacement are Karpenter's own code; only the machines are simulated.

Each lab pool becomes (`apply_pool`):

- a static NodePool `<pool>` (`spec.replicas` = the pool's size, the StaticCapacity feature gate):
  Karpenter keeps that many NodeClaims, so a deleted NodeClaim is replaced, which is what the
  karpenter pool backend's retire relies on (pools/karpenter.py);
- a static NodePool `<pool>-spare` (`spec.replicas` = the pool's spares) whose template carries the
  spare label and taint: hot spares as Karpenter users keep them, capacity held whatever the pods;
- one instance type per pool (its GPUs, CPUs, memory), offered on-demand in one zone, so that each
  NodePool launches exactly the pool's node shape.

Disruption budgets are `nodes: "0"`: Karpenter never drains a training node on its own (drift,
expiry); replacing nodes is the runbook's decision, made by deleting the NodeClaim.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx

from autoheal.errors import LabError
from autoheal.labels import GPU_RESOURCE, POOL_LABEL
from lab import controlplane, procs
from lab.config import PoolConfig
from lab.pool import node_labels, node_taints

SERVICE: Final = "karpenter"
BINARY: Final = "karpenter-kwok"
NODE_CLASS: Final = "autoheal"
SPARE_SUFFIX: Final = "-spare"
GROUP: Final = "karpenter.sh"
NODEPOOLS: Final = f"/apis/{GROUP}/v1/nodepools"
NODECLAIMS: Final = f"/apis/{GROUP}/v1/nodeclaims"
NODECLASSES: Final = "/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses"
ZONE: Final = "lab-zone-a"
# Karpenter's gates: static NodePools on; the rest as its defaults
FEATURE_GATES: Final = (
    "StaticCapacity=true,NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false,"
    "NodeOverlay=false,CapacityBuffer=false"
)
_APPLY: Final = {"Content-Type": "application/apply-patch+yaml"}
_MANAGER: Final = {"fieldManager": "autoheal-lab", "force": "true"}


def crd_dir() -> Path:
    """The CRDs of the built controller's version (the recipe copies them next to the binary)."""
    binary = controlplane.tool_path(BINARY).resolve()
    crds = binary.parent / "crds"
    if not any(crds.glob("*.yaml")):
        raise controlplane.ToolMissingError(
            f"{crds} holds no CRDs: rebuild karpenter (scripts/build-tools.sh --only karpenter)"
        )
    return crds


def instance_type_name(pool: PoolConfig) -> str:
    return f"lab-{pool.name}"


def instance_types(
    pools: Sequence[PoolConfig], node: controlplane.KubeNodeSpec | None = None
) -> list[dict[str, Any]]:
    """The KWOK provider's instance-types file: one type per pool, sized like the lab's KWOK nodes."""
    shape = node or controlplane.KubeNodeSpec("shape")
    return [
        {
            "name": instance_type_name(p),
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {
                "cpu": shape.cpu,
                "memory": shape.memory,
                "pods": str(shape.pods),
                "ephemeral-storage": "7Ti",
                GPU_RESOURCE: str(p.gpus_per_node),
            },
            "offerings": [
                {
                    "Price": 1.0,
                    "Available": True,
                    "Requirements": [
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
                    ],
                }
            ],
        }
        for p in pools
    ]


def node_pool(pool: PoolConfig, spare: bool) -> dict[str, Any]:
    """The static NodePool of a lab pool's active nodes, or of its spares."""
    name = pool.name + (SPARE_SUFFIX if spare else "")
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "NodePool",
        "metadata": {"name": name, "labels": {POOL_LABEL: pool.name}},
        "spec": {
            "replicas": pool.spares if spare else pool.size,
            "template": {
                "metadata": {"labels": node_labels(pool, spare)},
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.kwok.sh",
                        "kind": "KWOKNodeClass",
                        "name": NODE_CLASS,
                    },
                    "requirements": [
                        {
                            "key": "node.kubernetes.io/instance-type",
                            "operator": "In",
                            "values": [instance_type_name(pool)],
                        },
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    ],
                    "taints": node_taints(spare),
                    "expireAfter": "Never",
                },
            },
            # why: replacing a training node is the runbook's decision, never Karpenter's own
            "disruption": {"consolidateAfter": "Never", "budgets": [{"nodes": "0"}]},
        },
    }


def node_class() -> dict[str, Any]:
    return {
        "apiVersion": "karpenter.kwok.sh/v1alpha1",
        "kind": "KWOKNodeClass",
        "metadata": {"name": NODE_CLASS},
    }


def _apply(http: httpx.Client, collection: str, obj: dict[str, Any]) -> None:
    """Server-side apply: creates or updates, so a second run changes nothing."""
    r = http.patch(
        f"{collection}/{obj['metadata']['name']}", params=_MANAGER, content=json.dumps(obj), headers=_APPLY
    )
    if r.status_code not in (200, 201):
        raise LabError(
            f"applying {obj['kind']} {obj['metadata']['name']}: HTTP {r.status_code} {r.text[:400]}"
        )


def apply_crds(kubeconfig: Path, timeout: float = 60.0) -> list[str]:
    """Apply Karpenter's CRDs (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass); wait Established."""
    import yaml

    names = []
    with controlplane.http_client(kubeconfig, pool=2) as http:
        for path in sorted(crd_dir().glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            _apply(http, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            names.append(crd["metadata"]["name"])
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                conds = http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()
                if any(
                    c["type"] == "Established" and c["status"] == "True"
                    # a CRD just created may answer `status.conditions: null` for a moment
                    for c in (conds.get("status") or {}).get("conditions") or []
                ):
                    break
                if time.monotonic() > deadline:
                    raise LabError(f"CRD {name} not Established after {timeout:.0f}s")
                time.sleep(0.2)
    return names


def apply_pools(kubeconfig: Path, pools: Sequence[PoolConfig]) -> list[str]:
    """The KWOKNodeClass and each pool's NodePools (spare NodePool only where spares > 0)."""
    applied = []
    with controlplane.http_client(kubeconfig, pool=2) as http:
        _apply(http, NODECLASSES, node_class())
        for pool in pools:
            for spare in (False, True):
                if spare and pool.spares == 0:
                    continue
                np = node_pool(pool, spare)
                _apply(http, NODEPOOLS, np)
                applied.append(np["metadata"]["name"])
    return applied


def ports(port_base: int) -> tuple[int, int]:
    """The controller's metrics and health-probe ports: 6 and 7 above the control plane's base
    (controlplane.Ports takes base..base+5)."""
    return port_base + 6, port_base + 7


def start(
    run_dir: Path, kubeconfig: Path, pools: Sequence[PoolConfig], port_base: int, timeout: float = 60.0
) -> procs.Proc:
    """Apply the CRDs, the node class and the pools, then run the controller as a lab process
    (logs/karpenter.log, its PID file); returns once it reports ready."""
    binary = controlplane.tool_path(BINARY)
    apply_crds(kubeconfig)
    apply_pools(kubeconfig, pools)
    types_file = run_dir / "karpenter-instance-types.json"
    types_file.write_text(json.dumps(instance_types(pools), indent=1))
    metrics, probe = ports(port_base)
    env = {
        "KUBECONFIG": str(kubeconfig),
        "INSTANCE_TYPES_FILE_PATH": str(types_file),
        "FEATURE_GATES": FEATURE_GATES,
        "DISABLE_LEADER_ELECTION": "true",  # one controller per lab
        "METRICS_PORT": str(metrics),
        "HEALTH_PROBE_PORT": str(probe),
        "LOG_LEVEL": "info",
        # why: the lab's pools are static, nothing waits on pod batching
        "BATCH_IDLE_DURATION": "1s",
        "BATCH_MAX_DURATION": "2s",
    }
    for port in (metrics, probe):
        if not procs.port_free(port):
            raise LabError(f"{SERVICE}: port {port} is in use; choose another port_base")
    return procs.start_service(
        SERVICE,
        [str(binary)],
        run_dir,
        ready=procs.http_ok(f"http://127.0.0.1:{probe}/readyz"),
        timeout=timeout,
        env=env,
        cwd=run_dir,
    )


def stop(run_dir: Path) -> bool:
    """Stop the controller (by its PID file); True if it was running."""
    return procs.stop(run_dir, SERVICE)


def pool_nodes(kubeconfig: Path, nodepool: str) -> dict[str, bool]:
    """The Nodes Karpenter launched for a NodePool (its `karpenter.sh/nodepool` label): name -> in
    use, i.e. Ready and initialized by Karpenter (its `karpenter.sh/initialized` label: registered,
    so the NodePool's labels and taints are on it)."""
    with controlplane.http_client(kubeconfig, pool=1) as http:
        r = http.get("/api/v1/nodes", params={"labelSelector": f"{GROUP}/nodepool={nodepool}"})
        r.raise_for_status()
        out = {}
        for item in r.json().get("items", []):
            conds = item.get("status", {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            out[item["metadata"]["name"]] = (
                ready and item["metadata"]["labels"].get(f"{GROUP}/initialized") == "true"
            )
        return out
