"""A simulated node's sysfs: the files the watcher's link checks read (watcher/links.py).

The lab and the tests write this tree under a node's folder and start its watcher with
``--sysfs-root`` pointing at it; flapping a link is writing what the kernel would: the port's state
and its link_downed counter, or an interface's carrier counters. Files are replaced atomically (a
watcher never reads half a number).
"""

from __future__ import annotations

import os
from pathlib import Path

ACTIVE = "4: ACTIVE"
DOWN = "1: DOWN"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def ib_port(self, dev: str = "mlx5_0", port: int = 1) -> Path:
        return self.root / "class" / "infiniband" / dev / "ports" / str(port)

    def add_ib_port(self, dev: str = "mlx5_0", port: int = 1, **counters: int) -> Path:
        p = self.ib_port(dev, port)
        _write(p / "state", ACTIVE)
        _write(p / "phys_state", "5: LinkUp")
        values = {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0, "link_error_recovery": 0}
        for name, value in {**values, **counters}.items():
            _write(p / "counters" / name, str(value))
        return p

    def counter(self, dev: str, port: int, name: str) -> int:
        return int((self.ib_port(dev, port) / "counters" / name).read_text())

    def set_counter(self, dev: str, port: int, name: str, value: int) -> None:
        _write(self.ib_port(dev, port) / "counters" / name, str(value))

    def set_state(self, dev: str, port: int, active: bool) -> None:
        p = self.ib_port(dev, port)
        _write(p / "state", ACTIVE if active else DOWN)
        _write(p / "phys_state", "5: LinkUp" if active else "3: Disabled")

    def flap(self, dev: str = "mlx5_0", port: int = 1, times: int = 1) -> None:
        """The port lost its link `times` times and came back (link_downed grows by `times`)."""
        self.set_counter(dev, port, "link_downed", self.counter(dev, port, "link_downed") + times)

    def add_net(self, iface: str, physical: bool = True, carrier_changes: int = 2) -> Path:
        p = self.root / "class" / "net" / iface
        _write(p / "carrier_changes", str(carrier_changes))
        _write(p / "carrier_down_count", str(carrier_changes // 2))
        if physical:
            (p / "device").mkdir(parents=True, exist_ok=True)
        return p

    def add_pci(
        self,
        bdf: str,
        *,
        gpu: bool = True,
        width: int = 16,
        max_width: int = 16,
        speed: str = "32.0 GT/s PCIe",
        max_speed: str = "32.0 GT/s PCIe",
    ) -> Path:
        p = self.root / "bus" / "pci" / "devices" / bdf
        _write(p / "vendor", "0x10de" if gpu else "0x15b3")
        _write(p / "class", "0x030200" if gpu else "0x020700")
        self.set_link(bdf, width=width, speed=speed)
        _write(p / "max_link_width", str(max_width))
        _write(p / "max_link_speed", max_speed)
        return p

    def set_link(self, bdf: str, *, width: int | None = None, speed: str | None = None) -> None:
        p = self.root / "bus" / "pci" / "devices" / bdf
        if width is not None:
            _write(p / "current_link_width", str(width))
        if speed is not None:
            _write(p / "current_link_speed", speed)
