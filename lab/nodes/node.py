"""One real node: namespaces, containerd, images, kubelet, kube-proxy and the GPU device plugin.

A node is a set of processes sharing a mount and a network namespace, held open by a `sleep`
(the "holder", like a pod's pause container) and all placed in the node's cgroup. Starting one
is all-or-nothing: a step that fails stops the node again and names the service, the cause and
its log file.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autoheal.errors import LabError
from images.build import BuiltImage
from lab import controlplane, procs
from lab.nodes import cgroups, files, net, pki
from lab.nodes.files import NodePaths

SERVICES = ("kubelet", "kube-proxy", "gpu-plugin", "containerd", "holder")  # stop order
GPU_RESOURCE = "nvidia.com/gpu"
Progress = Callable[[str], None]


@dataclass(frozen=True)
class NodeSpec:
    name: str
    index: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    gpus: int = 8


@dataclass(frozen=True)
class LabContext:
    """What every real node of one lab shares."""

    run_dir: Path
    sock_dir: Path
    net: net.LabNet
    api_port: int
    images: tuple[BuiltImage, ...]
    simulator_state: Path

    @property
    def pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def server(self) -> str:
        return f"https://{self.net.gateway}:{self.api_port}"

    def paths(self, spec: NodeSpec) -> NodePaths:
        return NodePaths(nodes_dir(self.run_dir) / spec.name, self.sock_dir / f"n{spec.index}")

    def sandbox_ref(self) -> str:
        for img in self.images:
            if img.name == "pause":
                return img.ref
        raise LabError("real nodes: the pause image is not among the built images")


def nodes_dir(run_dir: Path) -> Path:
    """Where the lab keeps each real node's files, one folder a node."""
    return run_dir / "nodes"


def discard_store(run_dir: Path, name: str, running: Collection[str] | None = None) -> None:
    """A retired node's disk goes with it: its image store (~750 MB a node, the images unpacked)
    would otherwise fill the host's disk over a run of the suite, and the kubelets of later labs
    then evict for disk pressure. Only once its holder is gone (checked here; `running`: the
    lab's running process names, when the caller has them): the snapshots were mounted in the
    holder's namespace alone. Its logs stay for post-mortems."""
    if proc_name(name, "holder") in (procs.running(run_dir) if running is None else running):
        return
    shutil.rmtree(nodes_dir(run_dir) / name / files.CONTAINERD_DIR, ignore_errors=True)


def proc_name(node: str, service: str) -> str:
    return f"node-{node}-{service}"


def _tool_dir(name: str) -> Path:
    """The directory of a built tool (resolved: the CNI plugins must be alone in their dir)."""
    return controlplane.tool_path(name).resolve().parent


def _spawn(ctx: LabContext, spec: NodeSpec, service: str, argv: Sequence[str], ns_pid: int) -> procs.Proc:
    group = cgroups.node_group(ctx.net.lab, spec.name) + "/system"
    launcher = [sys.executable, "-m", "lab.nodes.enter", f"--cgroup={group}", f"--ns-pid={ns_pid}", "--"]
    path = os.pathsep.join(
        [
            str(_tool_dir("containerd")),
            str(_tool_dir("runc")),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ]
    )
    return procs.spawn(proc_name(spec.name, service), [*launcher, *argv], ctx.run_dir, env={"PATH": path})


def _holder(ctx: LabContext, spec: NodeSpec) -> procs.Proc:
    """A `sleep` in new mount + network namespaces (mounts private to it), inside the cgroup."""
    group = cgroups.node_group(ctx.net.lab, spec.name) + "/system"
    argv = [
        sys.executable,
        "-m",
        "lab.nodes.enter",
        f"--cgroup={group}",
        "--",
        "unshare",
        "--mount",
        "--net",
        "--propagation=private",
        "sleep",
        "infinity",
    ]
    proc = procs.spawn(proc_name(spec.name, "holder"), argv, ctx.run_dir)
    mine = os.readlink("/proc/self/ns/net")

    def ready() -> bool:
        return Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep" and (
            os.readlink(f"/proc/{proc.pid}/ns/net") != mine
        )

    procs.wait_until(ready, 10, f"node {spec.name}: namespace holder", proc, interval=0.02)
    return proc


def _private_mounts(paths: NodePaths, ns_pid: int) -> None:
    script = ["mount -t tmpfs -o mode=755 tmpfs /run", "mkdir -p /run/lock"]
    for target, sub in files.PRIVATE_DIRS.items():
        Path(target).mkdir(parents=True, exist_ok=True)  # a mount point on the host: an empty dir
        src = paths.dir / sub
        src.mkdir(parents=True, exist_ok=True)
        script.append(f"mount --bind {src} {target}")
    res = subprocess.run(
        ["nsenter", "-t", str(ns_pid), "-m", "sh", "-ec", " && ".join(script)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if res.returncode != 0:
        raise LabError(f"node {paths.dir.name}: private mounts failed: {res.stderr.strip()}")


# A node's image store holds each image compressed and unpacked: ~4.5x its registry size (760 MB
# for 166 MB of images, measured 2026-12-02)
STORE_PER_IMAGE_BYTE = 5
GIB = 1 << 30


def check_disk(paths: NodePaths, images: Sequence[BuiltImage]) -> None:
    """Refuse to start a node whose kubelet would taint itself disk-pressure: its pods would sit
    in ImagePullBackOff with nothing that names the cause."""
    st = os.statvfs(paths.dir)
    free = st.f_bavail * st.f_frsize
    floor = st.f_blocks * st.f_frsize * files.EVICTION_DISK_PERCENT / 100
    need = sum(i.size for i in images) * STORE_PER_IMAGE_BYTE
    if free - need < floor:
        raise LabError(
            f"node {paths.dir.name}: the disk under {paths.dir} has {free / GIB:.1f} GiB free; the node's "
            f"image store needs ~{need / GIB:.1f} GiB and its kubelet evicts every pod below "
            f"{floor / GIB:.1f} GiB free (evictionHard {files.EVICTION_DISK_PERCENT}%). Free some space: "
            "old labs (`autoheal lab down`), old test folders (/tmp/pytest-of-*)"
        )


NVIDIA_MAJOR = 195  # the character major of /dev/nvidia<N> (minor N)


def _gpu_devices(paths: NodePaths, gpus: int) -> None:
    """Character devices numbered as the real /dev/nvidiaN (195:N). With no driver behind them an
    open answers ENXIO, but each GPU is a device of its own, so a device cgroup can allow one and
    refuse another (EPERM): how a job is seen to get only the GPUs Slurm gave it."""
    paths.gpu_dev_dir.mkdir(parents=True, exist_ok=True)
    for i in range(gpus):
        dev = paths.gpu_dev_dir / f"nvidia{i}"
        want = os.makedev(NVIDIA_MAJOR, i)
        if dev.exists() and dev.stat().st_rdev == want:
            continue
        dev.unlink(missing_ok=True)
        os.mknod(dev, 0o666 | stat.S_IFCHR, want)
        dev.chmod(0o666)  # mknod's mode passes through the umask


def ctr(ctx: LabContext, spec: NodeSpec, args: Sequence[str], timeout: float = 120, **kw: object) -> str:
    argv = [
        str(controlplane.tool_path("ctr")),
        "--address",
        str(ctx.paths(spec).containerd_sock),
        "-n",
        "k8s.io",
        *args,
    ]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise LabError(f"node {spec.name}: `ctr {' '.join(args)}` failed: {str(res.stderr).strip()[-400:]}")
    return str(res.stdout)


def import_image(ctx: LabContext, spec: NodeSpec, img: BuiltImage) -> None:
    """Import an OCI layout into the node's containerd under its tag and its digest reference
    (CRI resolves a pod's `repo@sha256:...` by that exact name; there is no registry to ask)."""
    sock = ctx.paths(spec).containerd_sock
    tar = subprocess.Popen(
        ["tar", "-C", img.layout, "-cf", "-", "oci-layout", "index.json", "blobs"], stdout=subprocess.PIPE
    )
    try:
        res = subprocess.run(
            [
                str(controlplane.tool_path("ctr")),
                "--address",
                str(sock),
                "-n",
                "k8s.io",
                "images",
                "import",
                "-",
            ],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        if tar.stdout:
            tar.stdout.close()
        tar.wait(timeout=60)
    if res.returncode != 0 or tar.returncode != 0:
        raise LabError(f"node {spec.name}: importing image {img.name} failed: {res.stderr.strip()[-400:]}")
    ctr(ctx, spec, ["images", "tag", "--force", img.tagged, img.ref])


def start(ctx: LabContext, spec: NodeSpec, timeout: float = 180, progress: Progress = lambda _: None) -> None:
    """Start the node and wait until it is Ready with its GPUs allocatable."""
    deadline = time.monotonic() + timeout
    paths = ctx.paths(spec)
    stop(ctx, spec)  # leftovers of a crashed run of the same node
    shutil.rmtree(paths.dir, ignore_errors=True)
    for d in (paths.dir, paths.sock_dir, paths.etc, paths.cni_conf_dir, paths.kubelet_root):
        d.mkdir(parents=True, exist_ok=True)
    check_disk(paths, ctx.images)
    group = cgroups.node_group(ctx.net.lab, spec.name)
    try:
        cgroups.create(group + "/system")
        holder = _holder(ctx, spec)
        _private_mounts(paths, holder.pid)
        net.attach(ctx.net, spec.index, holder.pid)
        _gpu_devices(paths, spec.gpus)
        _write_configs(ctx, spec, paths)
        progress(f"node {spec.name}: containerd")
        cd = _spawn(
            ctx,
            spec,
            "containerd",
            [str(controlplane.tool_path("containerd")), "--config", str(paths.etc / "containerd.toml")],
            holder.pid,
        )
        procs.wait_until(
            lambda: bool(ctr(ctx, spec, ["version"], timeout=5)), 30, f"node {spec.name}: containerd", cd
        )
        for img in ctx.images:
            progress(f"node {spec.name}: importing image {img.name}")
            import_image(ctx, spec, img)
        progress(f"node {spec.name}: kubelet")
        kl = _spawn(ctx, spec, "kubelet", _kubelet_argv(spec, paths, ctx.net.node_ip(spec.index)), holder.pid)
        _spawn(
            ctx,
            spec,
            "kube-proxy",
            [str(controlplane.tool_path("kube-proxy")), f"--config={paths.etc / 'kube-proxy.yaml'}", "--v=1"],
            holder.pid,
        )
        if spec.gpus:  # a node without GPUs (a pods lab's system node) runs no device plugin
            _spawn(
                ctx,
                spec,
                "gpu-plugin",
                [
                    str(controlplane.tool_path("autoheal-gpu-device-plugin")),
                    f"--node={spec.name}",
                    f"--gpus={spec.gpus}",
                    f"--dev-dir={paths.gpu_dev_dir}",
                    f"--simulator-state={ctx.simulator_state}",
                ],
                holder.pid,
            )
        wait_ready(ctx, spec, max(1.0, deadline - time.monotonic()), kl)
    except BaseException:
        stop(ctx, spec)
        raise


def _kubelet_argv(spec: NodeSpec, paths: NodePaths, node_ip: str) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(spec.labels.items()))
    return [
        str(controlplane.tool_path("kubelet")),
        f"--config={paths.etc / 'kubelet.yaml'}",
        f"--kubeconfig={paths.etc / 'kubelet.kubeconfig'}",
        f"--root-dir={paths.kubelet_root}",
        f"--hostname-override={spec.name}",
        f"--node-ip={node_ip}",  # not loopback: the API server reaches the kubelet there
        *([f"--node-labels={labels}"] if labels else []),
        "--v=1",
    ]


def _write_configs(ctx: LabContext, spec: NodeSpec, paths: NodePaths) -> None:
    node_ip = ctx.net.node_ip(spec.index)
    crt, key = pki.client_cert(
        ctx.pki, f"system:node:{spec.name}", "system:nodes", paths.etc / "kubelet-client"
    )
    pki.kubeconfig(
        paths.etc / "kubelet.kubeconfig", ctx.pki, ctx.server, f"system:node:{spec.name}", crt, key
    )
    crt, key = pki.client_cert(ctx.pki, "system:kube-proxy", None, paths.etc / "kube-proxy-client")
    pki.kubeconfig(paths.etc / "kube-proxy.kubeconfig", ctx.pki, ctx.server, "system:kube-proxy", crt, key)
    (paths.etc / "containerd.toml").write_text(
        files.containerd_config(
            paths, _tool_dir("bridge"), controlplane.tool_path("runc").resolve(), ctx.sandbox_ref()
        )
    )
    (paths.cni_conf_dir / "10-autoheal.conflist").write_text(
        files.cni_config(ctx.net.pod_cidr(spec.index), paths.dir / "cni" / "ipam")
    )
    group = cgroups.node_group(ctx.net.lab, spec.name)
    (paths.etc / "kubelet.yaml").write_text(
        files.kubelet_config(paths, node_ip, group, spec.taints, ctx.pki / "ca.crt")
    )
    (paths.etc / "kube-proxy.yaml").write_text(
        files.kube_proxy_config(paths.etc / "kube-proxy.kubeconfig", spec.name, ctx.net.cidr)
    )


def wait_ready(ctx: LabContext, spec: NodeSpec, timeout: float, kubelet: procs.Proc | None = None) -> None:
    """Until the Node is Ready and advertises its GPUs (the device plugin registered)."""
    kubeconfig = ctx.run_dir / "kubeconfig"
    log = procs.log_path(ctx.run_dir, proc_name(spec.name, "kubelet"))

    def ready() -> bool:
        with controlplane.http_client(kubeconfig, pool=1, timeout=5) as http:
            r = http.get(f"/api/v1/nodes/{spec.name}")
            if r.status_code != 200:
                return False
            node = r.json()
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions") or []}
        gpus = node.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, "0")
        return conds.get("Ready") == "True" and int(gpus) == spec.gpus

    try:
        procs.wait_until(
            ready,
            timeout,
            f"node {spec.name}: kubelet registration (Ready with {spec.gpus} GPUs)",
            kubelet,
            0.5,
        )
    except LabError as exc:
        raise LabError(f"{exc} (kubelet log: {log})") from exc


def stop(ctx: LabContext, spec: NodeSpec) -> None:
    """Stop every process of the node, whatever state it is in, and remove what it made."""
    for service in SERVICES:
        procs.stop(ctx.run_dir, proc_name(spec.name, service), timeout=10)
    cgroups.remove(cgroups.node_group(ctx.net.lab, spec.name))
    net.detach(ctx.net, spec.index)
    shutil.rmtree(ctx.paths(spec).sock_dir, ignore_errors=True)
    discard_store(ctx.run_dir, spec.name)


def stop_service(ctx: LabContext, spec: NodeSpec, service: str) -> bool:
    """Stop one service of a node (e.g. its kubelet, to see the node go NotReady)."""
    return procs.stop(ctx.run_dir, proc_name(spec.name, service))


def services(spec: NodeSpec) -> tuple[str, ...]:
    """The node's processes (in stop order): no device plugin on a node without GPUs."""
    return SERVICES if spec.gpus else tuple(s for s in SERVICES if s != "gpu-plugin")


def is_running(ctx: LabContext, spec: NodeSpec) -> dict[str, bool]:
    live = procs.running(ctx.run_dir)
    return {s: proc_name(spec.name, s) in live for s in services(spec)}
