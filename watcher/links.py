"""Degraded links from sysfs: flapping ports, climbing NIC error counters, PCIe links trained down.

A sibling of the kernel-log reader in the same watcher process (watcher/daemon.py polls it every
`link_poll_seconds`). It reads, under a configurable sysfs root (``/sys`` on a node; tests and the
lab give a fake tree):

- ``class/infiniband/<dev>/ports/<port>/state`` (``4: ACTIVE``) and ``counters/link_downed``,
  ``counters/symbol_error``, ``counters/port_rcv_errors``, ``counters/link_error_recovery``;
- ``class/net/<iface>/carrier_down_count`` (else ``carrier_changes``, two per flap) of physical
  interfaces (those with a ``device`` link: veths and bridges come and go with pods, not links);
- ``bus/pci/devices/<bdf>/{current,max}_link_{width,speed}`` of NVIDIA GPUs and network devices.

The thresholds come from the fault catalogue (autoheal/data/fault_catalog.yaml):

- link_flap: flaps of one port within the window, a flap being a poll that saw the port leave
  ACTIVE, link_downed grow, or the carrier go down (whichever says more, never their sum), or a
  link line of the kernel log naming the port (watcher/link_lines.py: mlx5 "Link down", a cable
  unplugged or in error, a transmit timeout), matched against the counters so that one flap
  seen by both is counted once;
- nic_errors: growth of the error counters of one port within the window;
- pcie_downtrained: width or speed below the maximum on every poll for sustain_seconds.

The first poll only learns the counters (no alert for history); a counter that goes down was reset
or wrapped: the poll rebases on it and counts nothing. A file that is missing or unreadable is
skipped (a node with no InfiniBand has no class/infiniband at all).
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoheal.faults import DEGRADED_ALERT, FAULT_LABEL, FaultCatalog, FaultClass, FaultEntry
from autoheal.monitoring import SOURCE_LABEL, SOURCE_WATCHER
from autoheal.xid import Tier
from watcher.alerts import WatchAlert
from watcher.link_lines import LinkEvent

ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "link_error_recovery")
NVIDIA_VENDOR = "0x10de"
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")  # a sysfs entry we will put in a label
_SPEED = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
CREDIT_SECONDS = 10.0  # how long one source's flap waits to be matched by the other's (_merged)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")[:256].strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    raw = _read(path)
    if raw is None:
        return None
    try:
        return int(raw, 0)
    except ValueError:
        return None


def _entries(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if _NAME.fullmatch(p.name))
    except OSError:
        return []


def _bus_of(link: Path) -> str | None:
    """The PCI bus id a sysfs `device` link points at (../../../0000:3b:00.0), or None."""
    try:
        name = os.path.basename(os.path.realpath(link))
    except OSError:
        return None
    return name.lower() if _BDF.match(name.lower()) else None


def parse_speed(raw: str | None) -> float | None:
    """GT/s of a PCIe link speed (``16.0 GT/s PCIe``, ``8 GT/s``); None for Unknown or garbage."""
    m = _SPEED.match(raw or "")
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class PortSample:
    """One read of a port: its state word (ACTIVE, DOWN...) and counters (None: not there)."""

    active: bool | None
    link_downed: int | None
    carrier_downs: int | None  # times the carrier went down (a counter)
    errors: dict[str, int]


@dataclass(frozen=True)
class PcieSample:
    width: int | None
    max_width: int | None
    speed: float | None
    max_speed: float | None

    @property
    def downtrained(self) -> bool:
        narrow = self.width is not None and self.max_width is not None and 0 < self.width < self.max_width
        slow = self.speed is not None and self.max_speed is not None and 0 < self.speed < self.max_speed
        return narrow or slow

    def describe(self) -> str:
        return f"x{self.width} of x{self.max_width}, {self.speed:g} of {self.max_speed:g} GT/s".replace(
            "None", "?"
        )


def read_ports(root: Path) -> dict[str, PortSample]:
    """Every InfiniBand/RoCE port (``mlx5_0/1``) and physical network interface (``net/eth0``)."""
    out: dict[str, PortSample] = {}
    for dev in _entries(root / "class" / "infiniband"):
        for port in _entries(dev / "ports"):
            state = _read(port / "state")
            counters = port / "counters"
            errors = {c: v for c in ERROR_COUNTERS if (v := _int(counters / c)) is not None}
            out[f"{dev.name}/{port.name}"] = PortSample(
                active=None if state is None else state.upper().endswith("ACTIVE"),
                link_downed=_int(counters / "link_downed"),
                carrier_downs=None,
                errors=errors,
            )
    for iface in _entries(root / "class" / "net"):
        if not (iface / "device").exists():
            continue  # virtual: veth, bridge, loopback
        downs = _int(iface / "carrier_down_count")
        if downs is None and (changes := _int(iface / "carrier_changes")) is not None:
            downs = changes // 2  # a flap is a change down and one up
        out[f"net/{iface.name}"] = PortSample(active=None, link_downed=None, carrier_downs=downs, errors={})
    return out


def read_pcie(root: Path) -> dict[str, PcieSample]:
    """PCIe links of NVIDIA GPUs and of network devices, by bus id."""
    out: dict[str, PcieSample] = {}
    for dev in _entries(root / "bus" / "pci" / "devices"):
        cls = _read(dev / "class") or ""
        gpu = _read(dev / "vendor") == NVIDIA_VENDOR and cls.startswith("0x03")
        if not (gpu or cls.startswith("0x02")):
            continue
        out[dev.name] = PcieSample(
            width=_int(dev / "current_link_width"),
            max_width=_int(dev / "max_link_width"),
            speed=parse_speed(_read(dev / "current_link_speed")),
            max_speed=parse_speed(_read(dev / "max_link_speed")),
        )
    return out


def _growth(prev: int | None, cur: int | None) -> int:
    """How much a counter grew; 0 when it is new, missing, reset or wrapped (it went down)."""
    if prev is None or cur is None or cur < prev:
        return 0
    return cur - prev


@dataclass
class _Window:
    """Amounts seen with their times, summed over the last `seconds`."""

    seconds: float
    items: deque[tuple[float, int]] = field(default_factory=deque)

    def add(self, at: float, amount: int) -> int:
        if amount > 0:
            self.items.append((at, amount))
        while self.items and self.items[0][0] <= at - self.seconds:
            self.items.popleft()
        return sum(a for _, a in self.items)


@dataclass(frozen=True)
class Finding:
    fault: FaultClass
    device: str  # the port (mlx5_0/1, net/eth0) or PCIe bus id
    detail: str
    entry: FaultEntry


class LinkMonitor:
    """Polls sysfs and says which degraded faults hold now (pure state; no I/O but the reads)."""

    def __init__(self, root: Path, catalog: FaultCatalog) -> None:
        self.root = root
        self.catalog = catalog
        self.flap = catalog.get(FaultClass.LINK_FLAP.value)
        self.errors = catalog.get(FaultClass.NIC_ERRORS.value)
        self.pcie = catalog.get(FaultClass.PCIE_DOWNTRAINED.value)
        self._ports: dict[str, PortSample] = {}
        self._flaps: dict[str, _Window] = {}
        self._errs: dict[str, _Window] = {}
        self._down_since: dict[str, float] = {}
        self.polls = 0
        self._lock = threading.Lock()  # the reader thread adds kernel events, the link thread polls
        self._kernel: dict[str, int] = {}  # kernel link events per port since the last poll
        self._kernel_credit: dict[str, tuple[int, float]] = {}  # (flaps, since): see _merged
        self._sysfs_credit: dict[str, tuple[int, float]] = {}

    def poll(self, now: float) -> list[Finding]:
        self.polls += 1
        found = list(self._links(read_ports(self.root), now))
        found += self._pcie(read_pcie(self.root), now)
        return found

    def kernel_event(self, event: LinkEvent, at: float, now: float) -> None:
        """A link line of the kernel log (watcher/link_lines.py), read by the reader thread: one flap
        of the port it names, counted at the next poll. A line older than the flap window (a
        replay of the log at start) is history and counts nothing."""
        if self.flap is None or at < now - self.flap.window_seconds:
            return
        key = self._port_of(event)
        with self._lock:
            self._kernel[key] = self._kernel.get(key, 0) + 1

    def _port_of(self, event: LinkEvent) -> str:
        """The port key of a kernel event: its interface (net/<iface>) or the interface or
        InfiniBand port at its PCI bus id, as read_ports() names them; else kmsg/<device>."""
        net = self.root / "class" / "net"
        if event.iface and (net / event.iface / "device").exists():
            return f"net/{event.iface}"
        if event.bus:
            for iface in _entries(net):
                if _bus_of(iface / "device") == event.bus:
                    return f"net/{iface.name}"
            for dev in _entries(self.root / "class" / "infiniband"):
                ports = _entries(dev / "ports")
                if ports and _bus_of(dev / "device") == event.bus:
                    return f"{dev.name}/{ports[0].name}"
        return f"kmsg/{event.device}"

    def _merged(self, key: str, from_sysfs: int, from_kernel: int, now: float) -> int:
        """New flaps of a port seen by both sources: the same flap shows in a counter and in a
        log line, maybe one poll apart, so each source's flaps not yet seen by the other are held
        as a credit (for CREDIT_SECONDS) that the other's later report uses up: never their sum."""
        kc, k_at = self._kernel_credit.get(key, (0, now))
        sc, s_at = self._sysfs_credit.get(key, (0, now))
        kc = kc if now - k_at <= CREDIT_SECONDS else 0
        sc = sc if now - s_at <= CREDIT_SECONDS else 0
        s_new, kc = max(0, from_sysfs - kc), max(0, kc - from_sysfs)
        k_new, sc = max(0, from_kernel - sc), max(0, sc - from_kernel)
        both = min(s_new, k_new)
        self._kernel_credit[key] = (kc + k_new - both, now if k_new > both else k_at)
        self._sysfs_credit[key] = (sc + s_new - both, now if s_new > both else s_at)
        return max(s_new, k_new)

    def _links(self, ports: dict[str, PortSample], now: float) -> Iterator[Finding]:
        with self._lock:
            kernel, self._kernel = self._kernel, {}
        for key, cur in ports.items():
            prev = self._ports.get(key)
            self._ports[key] = cur
            # first sight: learn the counters, alert on nothing past (a kernel line is not past)
            from_sysfs = 0
            if prev is not None:
                left = 1 if prev.active is True and cur.active is False else 0
                carrier = _growth(prev.carrier_downs, cur.carrier_downs)
                from_sysfs = max(left, _growth(prev.link_downed, cur.link_downed), carrier)
            yield from self._count_flaps(key, self._merged(key, from_sysfs, kernel.pop(key, 0), now), now)
            if self.errors is not None and prev is not None:
                grew = sum(_growth(prev.errors.get(c), v) for c, v in cur.errors.items())
                w = self._errs.setdefault(key, _Window(self.errors.window_seconds))
                n = w.add(now, grew)
                if n >= self.errors.threshold:
                    detail = f"{n} error(s) on {key} in {self.errors.window_seconds}s"
                    yield Finding(FaultClass.NIC_ERRORS, key, detail, self.errors)
        for key in sorted(set(kernel) | {k for k in self._flaps if k.startswith("kmsg/")}):
            yield from self._count_flaps(key, kernel.get(key, 0), now)  # ports sysfs does not show
        for gone in set(self._ports) - set(ports):
            del self._ports[gone]  # a port that comes back is learnt afresh

    def _count_flaps(self, key: str, flaps: int, now: float) -> Iterator[Finding]:
        if self.flap is None:
            return
        w = self._flaps.setdefault(key, _Window(self.flap.window_seconds))
        n = w.add(now, flaps)
        if n >= self.flap.threshold:
            detail = f"{n} flap(s) of {key} in {self.flap.window_seconds}s"
            yield Finding(FaultClass.LINK_FLAP, key, detail, self.flap)

    def _pcie(self, devices: dict[str, PcieSample], now: float) -> list[Finding]:
        out: list[Finding] = []
        if self.pcie is None:
            return out
        for bdf, s in devices.items():
            if not s.downtrained:
                self._down_since.pop(bdf, None)
                continue
            since = self._down_since.setdefault(bdf, now)
            if now - since >= self.pcie.sustain_seconds:
                out.append(
                    Finding(FaultClass.PCIE_DOWNTRAINED, bdf, f"PCIe {bdf}: {s.describe()}", self.pcie)
                )
        for gone in set(self._down_since) - set(devices):
            del self._down_since[gone]
        return out


def degraded_alert(node: str, finding: Finding, catalog: FaultCatalog, at: float) -> WatchAlert | None:
    """The NodeDegraded alert of a finding (None on a notify-only rung: only counted)."""
    if finding.entry.tier is Tier.NOTIFY:
        return None
    labels = {
        "alertname": DEGRADED_ALERT,
        "severity": "warning",
        "tier": finding.entry.tier.value,
        FAULT_LABEL: finding.fault.value,
        "Hostname": node,
        "device": finding.device,
        SOURCE_LABEL: SOURCE_WATCHER,
    }
    annotations = {
        "summary": f"{finding.fault.value} on {node}: {finding.detail}",
        "fault_catalog_version": str(catalog.version),
    }
    return WatchAlert(labels, annotations, at)
