"""The kernel log's link lines (issue 36): a NIC port losing its link, its cable or its transmit
queue, as the drivers print them; the link check (watcher/links.py) counts each as a flap.

Formats, from the kernel sources (a netdev_*() line is "<driver> <bus id> <interface>: ..."):

- mlx5e, drivers/net/ethernet/mellanox/mlx5/core/en_main.c (mlx5e_update_carrier):
  ``mlx5_core 0000:3b:00.0 enp59s0f0np0: Link down``; an interface's own ``ib0: Link down``
  where a driver prints only the name;
- mlx5 port module events, .../mlx5/core/events.c (port_module; mlx5_port_module_event before
  5.x), through mlx5_core_info ("<func>:<line>:(pid <pid>): "):
  ``mlx5_core 0000:3b:00.0: port_module:254:(pid 0): Port module event: module 0, Cable unplugged``
  and ``... Port module event[error]: module 0, Cable error, Bad or shorted cable/module``
  ("Cable plugged" is the way back, not a fault);
- the transmit watchdog, net/sched/sch_generic.c (dev_watchdog):
  ``NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 3 timed out`` (up to 6.1; 6.2 adds
  `` 5120 ms``) and, from 6.7, ``mlx5_core 0000:3b:00.0 eth0: NETDEV WATCHDOG: CPU: 12:
  transmit queue 3 timed out 5120 ms``.

"Link up" and anything else is not an event. Names are checked before they become a label.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BUS = r"(?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
_IFACE = r"(?P<iface>[A-Za-z][A-Za-z0-9_.-]{0,14})"  # IFNAMSIZ: 15 characters
_NETDEV = rf"(?:(?P<drv>[a-z0-9_]{{1,32}}) {_BUS} )?{_IFACE}: "
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("link_down", re.compile(rf"^{_NETDEV}Link down\s*$")),
    (
        "cable",
        re.compile(
            rf"^mlx5_core {_BUS}: \w+:\d+:\(pid \d+\): Port module event(?:\[error\])?: module \d+,"
            r" (?P<status>Cable unplugged|Cable error)\b"
        ),
    ),
    (
        "tx_timeout",
        re.compile(rf"^NETDEV WATCHDOG: {_IFACE} \([^)]{{0,64}}\): transmit queue \d+ timed out\b"),
    ),
    ("tx_timeout", re.compile(rf"^{_NETDEV}NETDEV WATCHDOG: CPU: \d+: transmit queue \d+ timed out\b")),
)


@dataclass(frozen=True)
class LinkEvent:
    """One link event of the kernel log: what, and where (an interface, a PCI bus id, or both)."""

    what: str  # link_down | cable | tx_timeout
    iface: str | None
    bus: str | None

    @property
    def device(self) -> str:
        """The name the event goes by when nothing in sysfs says more: the interface, else the bus."""
        return self.iface or self.bus or "?"


def parse_link_line(message: str) -> LinkEvent | None:
    """The link event of one kernel message, or None."""
    text = message.strip()
    if len(text) > 512:
        return None
    for what, pattern in _PATTERNS:
        m = pattern.match(text)
        if m is not None:
            groups = m.groupdict()
            bus = groups.get("bus")
            return LinkEvent(what, groups.get("iface"), bus.lower() if bus else None)
    return None
