"""All the real nodes of one lab: their network, the API forwarder, cluster DNS, and the nodes.

Order of a lab with real nodes: `prepare` (the bridge, so the API server can advertise its
address) -> the control plane -> `start` (images, API forwarder, CoreDNS, the nodes). `teardown`
undoes everything, also after a crash or a `kill -9` of anything: it reads what the lab recorded
(nodes/state.json) and, independently of it, everything named by the lab's id (cgroups, bridge,
veths, blackhole route), so a second `lab up` always starts clean.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from autoheal.errors import LabError
from images.build import BuiltImage, build
from lab import controlplane, procs
from lab.nodes import cgroups, files, net, node
from lab.nodes.node import LabContext, NodeSpec

Progress = Callable[[str], None]
LAB_SERVICES = ("apiproxy", "coredns", "provisioner")  # one of each per lab, beside the nodes
DNS_HEALTH_PORT = 8080
DNS_READY_PORT = 8181
# On every real node: the lab stack pins slurmctld, the login node and the runner to real nodes
# (a pod on a KWOK node never runs, and real slurmds could not reach a controller there).
REAL_NODE_LABEL = "autoheal.io/lab-real-node"
# A pods lab's system node: no GPUs, in no pool; slurmctld, login and the runner run there, as a
# cloud cluster keeps them on a system node group, so a GPU node's drain never evicts them.
SYSTEM_NODE = "lab-system"
SYSTEM_LABEL = "autoheal.io/lab-system"


def _quiet(_: str) -> None:
    pass


def state_file(run_dir: Path) -> Path:
    return run_dir / "nodes" / "state.json"


def _read(run_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(state_file(run_dir).read_text())
    except (OSError, ValueError):
        return None
    return data


@contextlib.contextmanager
def _editing(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Read, change and write the state under a lock: the pool controller adds a replacement
    while it retires the node it replaces, and a stop takes seconds (a write of the state read
    before it dropped the replacement)."""
    path = state_file(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _read(run_dir)
        if state is None:
            raise LabError("real nodes: this lab has no real-node network")
        yield state
        _write(run_dir, state)


def _write(run_dir: Path, state: dict[str, Any]) -> None:
    path = state_file(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(path)


def enabled(run_dir: Path) -> bool:
    return state_file(run_dir).exists()


def check_tools() -> None:
    """Every binary a real node needs, before anything starts (a missing one names its builder)."""
    for tool in (
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "kubelet",
        "kube-proxy",
        "bridge",
        "host-local",
        "loopback",
        "portmap",
        "coredns",
        "autoheal-gpu-device-plugin",
    ):
        controlplane.tool_path(tool)
    for cmd in ("ip", "nsenter", "unshare", "iptables", "mount", "tar"):
        if shutil.which(cmd) is None:
            raise LabError(f"real nodes: `{cmd}` is not installed; run scripts/bootstrap.sh")
    cgroups.check()


def prepare(run_dir: Path) -> net.LabNet:
    """Clean up leftovers, then create the lab's bridge; returns the address plan."""
    check_tools()
    teardown(run_dir)
    lab_net = net.create(run_dir)
    _write(run_dir, {"net": lab_net.as_dict(), "nodes": {}, "next_index": 0})
    return lab_net


def context(run_dir: Path) -> LabContext:
    state = _read(run_dir)
    if state is None or "api_port" not in state:
        raise LabError(f"real nodes: {run_dir} has no running real nodes (nodes/state.json)")
    return LabContext(
        run_dir=run_dir,
        sock_dir=Path(state["sock_dir"]),
        net=net.LabNet(**state["net"]),
        api_port=int(state["api_port"]),
        images=tuple(_image(i) for i in state["images"]),
        simulator_state=Path(state["simulator_state"]),
    )


def _image(data: dict[str, Any]) -> BuiltImage:
    return BuiltImage(**{k: v for k, v in data.items() if k not in ("ref", "tagged")})


def start(
    run_dir: Path,
    sock_dir: Path,
    api_port: int,
    specs: Sequence[tuple[str, dict[str, str], list[dict[str, str]], int]],
    simulator_state: Path,
    progress: Progress = _quiet,
    timeout: float = 300,
) -> LabContext:
    """Build (or reuse) the images, start the API forwarder, CoreDNS and the volume provisioner,
    then the nodes (name, labels, taints, gpus); returns once all are Ready."""
    state = _read(run_dir)
    if state is None:
        raise LabError("real nodes: call prepare() before the control plane starts")
    images = build(progress=progress)
    state.update(
        api_port=api_port,
        sock_dir=str(sock_dir),
        simulator_state=str(simulator_state),
        images=[i.as_dict() for i in images],
    )
    _write(run_dir, state)
    ctx = context(run_dir)
    start_apiproxy(ctx)
    start_dns(ctx)
    start_provisioner(ctx)
    for name, labels, taints, gpus in specs:
        add(run_dir, name, labels, taints, gpus, progress=progress, timeout=timeout)
    return ctx


def start_apiproxy(ctx: LabContext) -> None:
    gw = ctx.net.gateway
    proc = procs.spawn(
        "apiproxy",
        [
            sys.executable,
            "-m",
            "lab.nodes.apiproxy",
            f"--listen={gw}:{ctx.api_port}",
            f"--to=127.0.0.1:{ctx.api_port}",
        ],
        ctx.run_dir,
    )

    def listening() -> bool:
        import socket

        with socket.create_connection((gw, ctx.api_port), timeout=1):
            return True

    procs.wait_until(listening, 15, "apiproxy", proc)


def volumes_dir(run_dir: Path) -> Path:
    return run_dir / "volumes"


def start_provisioner(ctx: LabContext) -> None:
    """The lab's dynamic volume provisioner (lab.nodes.provisioner) and its default StorageClass."""
    from lab.nodes.provisioner import STORAGE_CLASS

    kubeconfig = ctx.run_dir / "kubeconfig"
    argv = [sys.executable, "-m", "lab.nodes.provisioner", f"--kubeconfig={kubeconfig}"]
    proc = procs.spawn("provisioner", [*argv, f"--root={volumes_dir(ctx.run_dir)}"], ctx.run_dir)

    def ready() -> bool:
        with controlplane.http_client(kubeconfig, pool=1) as http:
            return http.get(f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}").status_code == 200

    procs.wait_until(ready, 30, "provisioner", proc)


def start_dns(ctx: LabContext) -> None:
    """CoreDNS on the bridge address, and the kube-dns Service (10.96.0.10) pointing at it."""
    corefile = ctx.run_dir / "nodes" / "Corefile"
    corefile.write_text(
        files.corefile(ctx.net.gateway, ctx.run_dir / "kubeconfig", DNS_HEALTH_PORT, DNS_READY_PORT)
    )
    proc = procs.spawn(
        "coredns", [str(controlplane.tool_path("coredns")), "-conf", str(corefile)], ctx.run_dir
    )
    import httpx

    procs.wait_until(
        lambda: httpx.get(f"http://{ctx.net.gateway}:{DNS_READY_PORT}/ready", timeout=1).status_code == 200,
        30,
        "coredns",
        proc,
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "clusterIP": files.DNS_SERVICE_IP,
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ],
        },
    }
    # no selector: the endpoint is CoreDNS on the bridge, outside any node
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-lab",
            "namespace": "kube-system",
            "labels": {"kubernetes.io/service-name": "kube-dns"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ctx.net.gateway], "conditions": {"ready": True}}],
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ],
    }
    with controlplane.http_client(ctx.run_dir / "kubeconfig", pool=1) as http:
        for path, obj in (
            ("/api/v1/namespaces/kube-system/services", service),
            ("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", slice_),
        ):
            r = http.post(path, json=obj)
            if r.status_code not in (200, 201, 409):
                raise LabError(f"coredns: creating {obj['kind']} kube-dns: {r.status_code} {r.text[:300]}")


def add(
    run_dir: Path,
    name: str,
    labels: dict[str, str],
    taints: list[dict[str, str]],
    gpus: int,
    progress: Progress = _quiet,
    timeout: float = 300,
) -> NodeSpec:
    """Start a real node named `name` (a fresh index: addresses are never reused while the lab
    lives) and route every other node's pods to it."""
    ctx = context(run_dir)
    labels = {**labels, REAL_NODE_LABEL: "true"}
    with _editing(run_dir) as state:
        if name in state["nodes"]:
            raise LabError(f"real nodes: {name} is already a real node of this lab")
        index = int(state["next_index"])
        state["nodes"][name] = {"index": index, "labels": labels, "taints": taints, "gpus": gpus}
        state["next_index"] = index + 1
    spec = NodeSpec(name, index, labels, taints, gpus)
    t0 = time.monotonic()
    try:
        node.start(ctx, spec, timeout=timeout, progress=progress)
    except BaseException:
        with _editing(run_dir) as state:
            state["nodes"].pop(name, None)
        raise
    sync_routes(run_dir)
    progress(f"node {name}: Ready in {time.monotonic() - t0:.1f}s")
    return spec


def spec(run_dir: Path, name: str) -> NodeSpec:
    state = _read(run_dir) or {}
    rec = state.get("nodes", {}).get(name)
    if rec is None:
        raise LabError(f"real nodes: {name} is not a real node of this lab")
    return NodeSpec(name, int(rec["index"]), rec["labels"], rec["taints"], int(rec["gpus"]))


def names(run_dir: Path) -> list[str]:
    state = _read(run_dir) or {}
    return list(state.get("nodes", {}))


def remove(run_dir: Path, name: str) -> bool:
    """Stop a real node (its kubelet and containerd, its pods' processes) and forget it. The
    Node object is the caller's to delete. False if it was not a real node."""
    if name not in names(run_dir):
        return False
    node.stop(context(run_dir), spec(run_dir, name))
    with _editing(run_dir) as state:
        state["nodes"].pop(name, None)
    sync_routes(run_dir)
    return True


def restart(run_dir: Path, name: str, timeout: float = 300) -> None:
    """Reboot a real node: everything on it stops at once, then it starts again with the same
    index (so the same address and pod range) and re-registers with its Node object."""
    node.start(context(run_dir), spec(run_dir, name), timeout=timeout)
    sync_routes(run_dir)


def sync_routes(run_dir: Path) -> None:
    ctx = context(run_dir)
    live: dict[int, int] = {}
    running = procs.running(run_dir)
    for name in names(run_dir):
        holder = running.get(node.proc_name(name, "holder"))
        if holder is not None:
            live[spec(run_dir, name).index] = holder.pid
    net.sync_routes(ctx.net, live)


def status(run_dir: Path) -> dict[str, bool]:
    """service -> running, for the lab-wide services and every service of every real node."""
    running = procs.running(run_dir)
    out = {s: s in running for s in LAB_SERVICES}
    for name in names(run_dir):
        for service in node.services(spec(run_dir, name)):
            out[node.proc_name(name, service)] = node.proc_name(name, service) in running
    return out


def teardown(run_dir: Path) -> list[str]:
    """Stop every real node and lab-wide service, then remove every cgroup, veth, route and the
    bridge that carry this lab's id, whether or not the state file still knows them."""
    run_dir = run_dir.resolve()
    lab = net.lab_id(run_dir)
    pid_dir = procs.pid_dir(run_dir)
    ours = sorted(p.stem for p in pid_dir.glob("node-*.json")) if pid_dir.is_dir() else []
    stopped = procs.stop_many(run_dir, [*ours, *LAB_SERVICES])
    cgroups.remove(cgroups.lab_group(lab))
    state = _read(run_dir)
    if state is not None:
        net.destroy(net.LabNet(**state["net"]))
    else:
        for block in net.BLOCKS:  # no record: look for a bridge with our id in any block
            candidate = net.LabNet(lab, block)
            if net.bridge_exists(candidate):
                net.destroy(candidate)
                break
    if state is not None and state.get("sock_dir"):
        for name in state.get("nodes", {}):
            shutil.rmtree(Path(state["sock_dir"]) / f"n{state['nodes'][name]['index']}", ignore_errors=True)
    running = procs.running(run_dir)
    for node_dir in node.nodes_dir(run_dir).glob("*/"):
        node.discard_store(run_dir, node_dir.name, running)
    state_file(run_dir).unlink(missing_ok=True)
    # the volumes' API objects went with the control plane: their directories are orphans
    shutil.rmtree(volumes_dir(run_dir), ignore_errors=True)
    return stopped
