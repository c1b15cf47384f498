"""Real nodes for the tests: a control plane with two real nodes (no Slurm, no KWOK nodes).

Skips loudly, naming the tool, when a real-node binary is not built (scripts/build-tools.sh
builds them all; CI always has them) or when this is not root on a machine with the kernel
features the nodes need.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoheal.errors import LabError
from lab import controlplane
from lab.nodes import cluster, node
from tests.support import port_base, wait_for

PORT_BASE = port_base(27700)  # control plane: +0..+5
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
GPUS = 4
# The node controller's grace for these nodes (Kubernetes' default: 50 s): the NotReady test waits
# it out; the kubelets renew their Lease every 10 s, so 25 s still misses two renewals first
NODE_GRACE = 25


def require_real_nodes() -> None:
    if os.geteuid() != 0:
        pytest.skip("REAL NODES NOT TESTED: needs root (namespaces, cgroups, bridges)")
    try:
        cluster.check_tools()
        for tool in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
            controlplane.tool_path(tool)
    except (LabError, controlplane.ToolMissingError) as exc:
        pytest.skip(f"REAL NODES NOT TESTED: {exc}")
    if shutil.which("mmdebstrap") is None:
        pytest.skip("REAL NODES NOT TESTED: mmdebstrap is not installed (scripts/bootstrap.sh installs it)")


class Cluster:
    """A running control plane with real nodes, and the API calls the tests need."""

    def __init__(self, run_dir: Path, ctx: node.LabContext) -> None:
        self.run_dir = run_dir
        self.ctx = ctx
        self.kubeconfig = run_dir / "kubeconfig"
        self.http = controlplane.http_client(self.kubeconfig, pool=4)

    def image(self, name: str) -> str:
        return next(i.ref for i in self.ctx.images if i.name == name)

    def create(self, obj: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
        kind = obj["kind"]
        path = {
            "Pod": f"/api/v1/namespaces/{namespace}/pods",
            "Service": f"/api/v1/namespaces/{namespace}/services",
            "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        }[kind]
        r = self.http.post(path, json=obj)
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        r = self.http.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def phase(self, name: str) -> str:
        p = self.pod(name)
        return p["status"].get("phase", "") if p else "Gone"

    def wait_phase(self, name: str, phases: set[str], timeout: float = 120) -> str:
        return str(
            wait_for(lambda: (ph := self.phase(name)) in phases and ph, timeout, f"pod {name} in {phases}")
        )

    def logs(self, name: str) -> str:
        r = self.http.get(f"/api/v1/namespaces/default/pods/{name}/log")
        r.raise_for_status()
        return r.text

    def evict(self, name: str) -> int:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"},
        }
        return self.http.post(f"/api/v1/namespaces/default/pods/{name}/eviction", json=body).status_code

    def node(self, name: str) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/nodes/{name}")
        r.raise_for_status()
        out: dict[str, Any] = r.json()
        return out

    def ready(self, name: str) -> str:
        conds = {c["type"]: c["status"] for c in self.node(name)["status"].get("conditions") or []}
        return conds.get("Ready", "")


def pod_spec(
    name: str, image: str, command: list[str], node_name: str | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "containers": [{"name": "c", "image": image, "command": command}],
    }
    if node_name:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    spec.update(extra)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": spec,
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="package")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_real_nodes()
    run_dir = tmp_path_factory.mktemp("realnodes") / "rn"
    run_dir.mkdir()
    sock_dir = Path("/tmp") / f"ahrt-{uuid.uuid4().hex[:8]}"
    (run_dir / "simulator.json").write_text(json.dumps({"nodes": {}, "xids": []}))
    try:
        t0 = time.monotonic()
        lab_net = cluster.prepare(run_dir)
        controlplane.start_control_plane(
            run_dir,
            [],
            PORT_BASE,
            timeout=120,
            advertise_address=lab_net.gateway,
            node_grace_seconds=NODE_GRACE,
        )
        specs = [(f"rn-{i}", {"autoheal.io/pool": "h100"}, TAINT, GPUS) for i in (1, 2)]
        ctx = cluster.start(
            run_dir,
            sock_dir,
            controlplane.Ports.from_base(PORT_BASE).apiserver,
            specs,
            run_dir / "simulator.json",
        )
        print(f"\n[real nodes] control plane + 2 real nodes up in {time.monotonic() - t0:.1f}s")
        c = Cluster(run_dir, ctx)
        yield c
        c.http.close()
    finally:
        cluster.teardown(run_dir)
        controlplane.stop_control_plane(run_dir)
        shutil.rmtree(sock_dir, ignore_errors=True)
