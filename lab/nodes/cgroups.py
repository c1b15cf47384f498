"""Per-node cgroups (v1, cgroupfs): the kubelet's cgroup root, and the net that catches every process.

This machine kind mounts the cgroup v1 hierarchies (cgroup2 only at /sys/fs/cgroup/unified, with no
controllers), so the kubelet runs with `cgroupDriver: cgroupfs` and a `cgroupRoot` that must exist
in every hierarchy first. Each lab gets `/autoheal.<id>`, each node `/autoheal.<id>/<node>`: the
kubelet puts its pods under it, and every daemon of the node (containerd and its shims, the
kubelet, kube-proxy, the device plugin, the namespace holder) is started inside `<node>/system`.
So "every process of this node" is exactly the processes in the node's subtree, whoever started
them and whether or not their parent was killed with -9: teardown kills those and removes the
directories, and nothing outside the lab's cgroups is ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from autoheal.errors import LabError

ROOT = Path("/sys/fs/cgroup")


def hierarchies(v2: bool = False) -> list[Path]:
    """Mounted v1 hierarchies (controllers and named ones such as name=systemd), and with `v2`
    the cgroup2 mount too: runc mirrors containers' cgroups into it on a hybrid host, so
    teardown must look there as well."""
    kinds = {"cgroup", "cgroup2"} if v2 else {"cgroup"}
    out: list[Path] = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] in kinds and fields[1].startswith(str(ROOT) + "/"):
            out.append(Path(fields[1]))
    return sorted(set(out))


def check() -> None:
    """The kernel features a real node needs: cgroup v1 controllers, overlayfs, namespaces."""
    names = {h.name for h in hierarchies()}
    missing = {"cpu", "memory", "pids", "devices", "cpuset", "freezer"} - {
        n for h in names for n in h.split(",")
    }
    if missing:
        raise LabError(
            f"real nodes: cgroup v1 controllers {', '.join(sorted(missing))} are not mounted under {ROOT}; "
            "the lab's kubelets use the cgroupfs driver on cgroup v1"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise LabError("real nodes: the kernel has no overlayfs (containerd's snapshotter needs it)")
    for ns in ("net", "mnt"):
        if not Path(f"/proc/self/ns/{ns}").exists():
            raise LabError(f"real nodes: the kernel has no {ns} namespaces")


def lab_group(lab_id: str) -> str:
    return f"autoheal.{lab_id}"


def node_group(lab_id: str, node: str) -> str:
    return f"{lab_group(lab_id)}/{node}"


def create(rel: str) -> None:
    """mkdir `rel` (and its parents) in every hierarchy; cpuset dirs inherit cpus and mems, which
    a new cpuset directory otherwise lacks (no process could join it)."""
    for h in hierarchies():
        parts = Path(rel).parts
        path = h
        for part in parts:
            parent, path = path, path / part
            if not path.is_dir():
                path.mkdir()
                if (path / "cpuset.cpus").exists():
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        (path / f).write_text((parent / f).read_text())


def join(rel: str, pid: int | None = None) -> None:
    """Move `pid` (default: this process) into `rel` in every hierarchy."""
    me = str(pid or os.getpid())
    for h in hierarchies():
        (h / rel / "cgroup.procs").write_text(me)


def pids(rel: str) -> set[int]:
    """Every process in `rel` and below, in any hierarchy."""
    found: set[int] = set()
    for h in hierarchies(v2=True):
        base = h / rel
        if not base.is_dir():
            continue
        for dirpath, _, files in os.walk(base):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    found |= {int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split()}
    return found


def kill_all(rel: str, timeout: float = 10.0) -> int:
    """SIGKILL every process in the subtree until none is left (a fork racing the first round is
    caught by the next). Returns how many were signalled."""
    total = 0
    deadline = time.monotonic() + timeout
    while (live := pids(rel)) and time.monotonic() < deadline:
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        total += len(live)
        time.sleep(0.05)
    if pids(rel):
        raise LabError(f"real nodes: processes in cgroup {rel} survive SIGKILL: {sorted(pids(rel))[:10]}")
    return total


def remove(rel: str, timeout: float = 10.0) -> None:
    """Kill the subtree's processes, then rmdir its directories deepest first, in every hierarchy."""
    kill_all(rel, timeout)
    deadline = time.monotonic() + timeout
    for h in hierarchies(v2=True):
        base = h / rel
        if not base.is_dir():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(base)), key=lambda p: len(p.parts), reverse=True)
        for d in dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while the last exited task is released
                    if time.monotonic() > deadline:
                        raise LabError(f"real nodes: cannot remove cgroup {d}: {exc.strerror}") from exc
                    time.sleep(0.05)
