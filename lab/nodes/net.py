"""The lab's node network: one bridge per lab, one network namespace per real node.

Each real node is its own network namespace joined to the lab's bridge by a veth pair, as kind's
node containers are: its own IP, its own iptables (so each node's kube-proxy owns its KUBE-*
chains), its own kubelet port. The addresses come from one /16 per lab, picked at `lab up` from
10.200-249.x.x so that it overlaps nothing on the host:

    10.X.0.0/24      the node network; the bridge (host side) is .1, node i is .(2 + i)
    10.X.(1 + i).0/24  node i's pods (its CNI bridge, cni0, is .1)

Pod traffic between nodes is bridged at layer 2: every node routes each other node's pod /24 to
that node's IP (routes kept by `sync_routes`, the job kindnet does in kind). Nodes have no default
route, so nothing from a node or a pod can leave the machine; the host gets a blackhole route for
the whole /16 so its replies can never leave either. Everything carries the lab's id: bridge
`ahb<id>`, host-side veths `ahv<id><index>`.
"""

from __future__ import annotations

import fcntl
import hashlib
import ipaddress
import json
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from autoheal.errors import LabError

BLOCKS = range(200, 250)  # second octet of the candidate 10.X.0.0/16 blocks
MAX_NODES = 250
# Real nodes need root (network namespaces), and root has the FHS lock dir
LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir())


def lab_id(run_dir: Path) -> str:
    """8 hex digits naming everything a lab creates outside its run dir (the same lab dir always
    gives the same id, so teardown after a crash finds what an earlier `up` made)."""
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]


@dataclass(frozen=True)
class LabNet:
    """The address plan of one lab."""

    lab: str  # lab_id
    block: int  # X of 10.X.0.0/16

    @property
    def bridge(self) -> str:
        return f"ahb{self.lab}"

    @property
    def cidr(self) -> str:
        return f"10.{self.block}.0.0/16"

    @property
    def node_cidr(self) -> str:
        return f"10.{self.block}.0.0/24"

    @property
    def gateway(self) -> str:
        """The bridge's address: the API server proxy and cluster DNS listen here."""
        return f"10.{self.block}.0.1"

    def node_ip(self, index: int) -> str:
        _check_index(index)
        return f"10.{self.block}.0.{2 + index}"

    def pod_cidr(self, index: int) -> str:
        _check_index(index)
        return f"10.{self.block}.{1 + index}.0/24"

    def veth(self, index: int) -> str:
        _check_index(index)
        return f"ahv{self.lab}{index:03x}"  # 14 characters: below IFNAMSIZ (15)

    def as_dict(self) -> dict[str, object]:
        return {"lab": self.lab, "block": self.block}


def _check_index(index: int) -> None:
    if not 0 <= index < MAX_NODES:
        raise LabError(f"real nodes: node index {index} outside 0..{MAX_NODES - 1}")


def ip(
    args: Sequence[str], ns_pid: int | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `ip ARGS` on the host, or inside the network namespace of `ns_pid`."""
    argv = ["ip", *args] if ns_pid is None else ["nsenter", "-t", str(ns_pid), "-n", "ip", *args]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    if check and res.returncode != 0:
        raise LabError(f"network: `{' '.join(argv)}` failed: {res.stderr.strip()}")
    return res


def _json(args: Sequence[str]) -> list[dict[str, object]]:
    out = ip(["-j", *args]).stdout.strip()
    data = json.loads(out) if out else []
    return data if isinstance(data, list) else []


@contextmanager
def _alloc_lock() -> Iterator[None]:
    """Two labs coming up at once must not pick the same block: the lock is the machine's, in its
    lock dir, not in a temp dir that a test run points elsewhere (tests/scratch.py)."""
    with (LOCK_DIR / "autoheal-netblocks.lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    nets: list[ipaddress.IPv4Network] = []
    for route in _json(["route", "show", "table", "all"]):
        dst = str(route.get("dst", ""))
        if dst and dst != "default" and ":" not in dst:
            try:
                nets.append(ipaddress.IPv4Network(dst if "/" in dst else f"{dst}/32", strict=False))
            except ValueError:
                continue
    for link in _json(["addr"]):
        for a in link.get("addr_info", []) or []:  # type: ignore[attr-defined]
            if a.get("family") == "inet":
                nets.append(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


def create(run_dir: Path) -> LabNet:
    """Pick a free /16 and create the lab's bridge with its gateway address and host routes."""
    lab = lab_id(run_dir)
    with _alloc_lock():
        used = _used_networks()
        for block in BLOCKS:
            cand = ipaddress.IPv4Network(f"10.{block}.0.0/16")
            if not any(cand.overlaps(n) for n in used):
                break
        else:
            raise LabError("network: every 10.200-249.0.0/16 block overlaps a route or address on this host")
        net = LabNet(lab, block)
        ip(["link", "add", net.bridge, "type", "bridge"])
        try:
            ip(["addr", "add", f"{net.gateway}/24", "dev", net.bridge])
            ip(["link", "set", net.bridge, "up"])
            # replies to pods go to their node; anything else in the block is dropped here
            ip(["route", "add", "blackhole", net.cidr])
        except BaseException:
            ip(["link", "del", net.bridge], check=False)
            raise
    return net


def destroy(net: LabNet) -> None:
    """Remove the bridge (its veths and routes go with it) and the blackhole route."""
    for link in _json(["link", "show", "master", net.bridge]) if bridge_exists(net) else []:
        ip(["link", "del", str(link["ifname"])], check=False)
    ip(["link", "del", net.bridge], check=False)
    ip(["route", "del", "blackhole", net.cidr], check=False)


def bridge_exists(net: LabNet) -> bool:
    return ip(["link", "show", net.bridge], check=False).returncode == 0


def attach(net: LabNet, index: int, ns_pid: int) -> None:
    """Wire node `index`, whose namespaces are held by `ns_pid`, to the lab bridge."""
    host_if = net.veth(index)
    ip(["link", "del", host_if], check=False)  # a leftover of a crashed node
    ip(["link", "add", host_if, "type", "veth", "peer", "name", f"{host_if}p"])
    ip(["link", "set", f"{host_if}p", "netns", str(ns_pid)])
    ip(["link", "set", host_if, "master", net.bridge, "up"])
    ip(["link", "set", "lo", "up"], ns_pid)
    ip(["link", "set", f"{host_if}p", "name", "eth0"], ns_pid)
    ip(["addr", "add", f"{net.node_ip(index)}/24", "dev", "eth0"], ns_pid)
    ip(["link", "set", "eth0", "up"], ns_pid)
    # the node forwards between its pods' bridge and eth0 (a router for its pod /24)
    sysctl(ns_pid, "net.ipv4.ip_forward", "1")
    ip(["route", "replace", net.pod_cidr(index), "via", net.node_ip(index), "dev", net.bridge])


def detach(net: LabNet, index: int) -> None:
    ip(["route", "del", net.pod_cidr(index)], check=False)
    ip(["link", "del", net.veth(index)], check=False)


def sysctl(ns_pid: int, key: str, value: str) -> None:
    """Set a per-namespace sysctl inside the node (never the host's)."""
    path = "/proc/sys/" + key.replace(".", "/")
    subprocess.run(
        ["nsenter", "-t", str(ns_pid), "-n", "sh", "-c", f"echo {value} > {path}"],
        check=True,
        timeout=10,
        capture_output=True,
    )


def sync_routes(net: LabNet, nodes: dict[int, int]) -> None:
    """Give every live node (index -> namespace pid) a route to every other node's pods."""
    for index, pid in nodes.items():
        want = {net.pod_cidr(j): net.node_ip(j) for j in nodes if j != index}
        res = ip(["-j", "route", "show", "proto", "static"], pid, check=False)
        have = {str(r["dst"]) for r in json.loads(res.stdout or "[]")} if res.returncode == 0 else set()
        for cidr, via in want.items():
            ip(["route", "replace", cidr, "via", via, "dev", "eth0", "proto", "static"], pid, check=False)
        for cidr in have - set(want):
            ip(["route", "del", cidr], pid, check=False)
