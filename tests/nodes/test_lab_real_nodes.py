"""`lab up` with real nodes beside KWOK ones; the pool controller replaces a real node with a
fresh real node; after a kill -9 of the lab's processes, `lab down` leaves nothing and a second
`lab up` starts clean."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lab import controlplane, pool, procs
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.nodes import cgroups, cluster, net
from tests.nodes.conftest import require_real_nodes
from tests.support import port_base, wait_for

pytestmark = pytest.mark.timeout(1200)


def _nodes(cfg: LabConfig) -> dict[str, dict]:
    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        return {n["metadata"]["name"]: n for n in http.get("/api/v1/nodes").json()["items"]}


def _ready(n: dict) -> bool:
    """Ready, and the node lifecycle controller has taken its not-ready taint off (it does so
    after the Ready condition turns True, not with it)."""
    lifecycle = [t for t in n["spec"].get("taints") or [] if t["key"].startswith("node.kubernetes.io/")]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
    return ready and not lifecycle


def _is_real(n: dict) -> bool:
    return n["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")


def _leftovers(run_dir: Path) -> list[str]:
    """Everything a lab with real nodes creates outside its run dir, named by its id."""
    lab = net.lab_id(run_dir)
    found = [
        str(h / cgroups.lab_group(lab))
        for h in cgroups.hierarchies(v2=True)
        if (h / cgroups.lab_group(lab)).exists()
    ]
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    found += [line.split()[0] for line in links.splitlines() if lab in line]
    routes = subprocess.run(
        ["ip", "route", "show", "type", "blackhole"], capture_output=True, text=True, check=True
    )
    mine = cluster._read(run_dir)
    if mine:
        found += [r for r in routes.stdout.splitlines() if net.LabNet(**mine["net"]).cidr in r]
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(run_dir) in line]
    # a node's image store goes with it (the disk of a run of the suite stays small)
    found += [str(d) for d in run_dir.glob("nodes/*/containerd") if d.exists()]
    return found


def test_real_nodes_in_the_lab_are_replaced_by_the_pool_and_torn_down_to_nothing(tmp_path: Path) -> None:
    require_real_nodes()
    cfg = LabConfig(
        name="rnlab",
        root=tmp_path,
        port_base=port_base(27800),
        pools=[PoolConfig(size=2, spares=1, headroom=2, gpus_per_node=4)],
        real_nodes=2,
        runner=False,
        provision_delay=1,
    )
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        print(f"\n[real nodes] lab up with 2 real + 1 KWOK nodes: {time.monotonic() - t0:.1f}s")
        nodes = _nodes(cfg)
        assert sorted(nodes) == ["gpu-1", "gpu-2", "gpu-3"]
        assert [_is_real(nodes[n]) for n in ("gpu-1", "gpu-2", "gpu-3")] == [True, True, False]
        # the same identity either way: pool labels, spare label/taint, GPU capacity
        for n in nodes.values():
            assert n["metadata"]["labels"]["autoheal.io/pool"] == "h100"
            assert n["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        assert {t["key"] for t in nodes["gpu-2"]["spec"]["taints"]} == {"nvidia.com/gpu"}
        assert labmod.status(cfg).healthy

        # the pool controller retires a real node: kubelet and containerd stop, the Node goes,
        # and a fresh real node (a spare: label and taint) takes its place
        old = procs.running(cfg.run_dir)["node-gpu-1-kubelet"]
        t1 = time.monotonic()
        assert pool.client_retire(cfg, "gpu-1")["changed"]
        assert not procs.is_alive(old)
        assert not cgroups.pids(cgroups.node_group(net.lab_id(cfg.run_dir), "gpu-1"))
        wait_for(
            lambda: "gpu-4" in (ns := _nodes(cfg)) and _ready(ns["gpu-4"]),
            180,
            "real replacement gpu-4 Ready",
        )
        print(
            f"[real nodes] real replacement Ready {time.monotonic() - t1:.1f}s after the retire (delay 1 s)"
        )
        nodes = _nodes(cfg)
        assert "gpu-1" not in nodes and _is_real(nodes["gpu-4"])
        assert nodes["gpu-4"]["metadata"]["labels"].get("autoheal.io/spare") == "true"
        assert {t["key"] for t in nodes["gpu-4"]["spec"]["taints"]} == {"nvidia.com/gpu", "autoheal.io/spare"}
        assert cluster.names(cfg.run_dir) == ["gpu-2", "gpu-4"]

        # kill -9 of everything the lab runs (node daemons, control plane, Slurm, ...): the
        # containers and namespaces outlive their parents, so only the lab's id finds them
        for p in procs.running(cfg.run_dir).values():
            os.killpg(p.pid, signal.SIGKILL)
        wait_for(lambda: not procs.running(cfg.run_dir), 30, "every lab process to die")
        t2 = time.monotonic()
        labmod.up(cfg)  # a second `up` after the kill starts clean
        print(f"[real nodes] lab up again after kill -9: {time.monotonic() - t2:.1f}s")
        assert labmod.status(cfg).healthy
        assert sorted(n for n, v in _nodes(cfg).items() if _is_real(v)) == ["gpu-1", "gpu-2"]
    finally:
        labmod.down(cfg)
    assert _leftovers(cfg.run_dir) == []
