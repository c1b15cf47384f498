"""The kernel log's link lines as link flaps (issue 36): the real formats of mlx5e's carrier
messages, mlx5's port module events and the transmit watchdog (watcher/link_lines.py, whose
docstring names the kernel sources), counted by the link check once per flap even when the
sysfs counters saw the same flap (watcher/links.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from autoheal.faults import FaultClass, load_fault_catalog
from lab.sysfs import FakeSysfs
from tests.watcher.conftest import link_watcher
from watcher.link_lines import LinkEvent, parse_link_line
from watcher.links import CREDIT_SECONDS, LinkMonitor
from watcher.sources import Line

CAT = load_fault_catalog()
FLAP = CAT.require(FaultClass.LINK_FLAP)
BUS = "0000:3b:00.0"


@pytest.mark.parametrize(
    ("line", "event"),
    [
        # mlx5e_update_carrier (netdev_info: driver, bus id, interface)
        ("mlx5_core 0000:3b:00.0 enp59s0f0np0: Link down", LinkEvent("link_down", "enp59s0f0np0", BUS)),
        (
            "mlx5_core 0000:3B:00.1 ibp59s0f1: Link down\n",
            LinkEvent("link_down", "ibp59s0f1", "0000:3b:00.1"),
        ),
        ("ib0: Link down", LinkEvent("link_down", "ib0", None)),
        # port module events: events.c's port_module (5.x+) and mlx5_port_module_event (4.x)
        (
            "mlx5_core 0000:3b:00.0: port_module:254:(pid 0): Port module event: module 0, Cable unplugged",
            LinkEvent("cable", None, BUS),
        ),
        (
            "mlx5_core 0000:3b:00.0: mlx5_port_module_event:320:(pid 0): Port module event[error]:"
            " module 1, Cable error, Bad or shorted cable/module",
            LinkEvent("cable", None, BUS),
        ),
        # dev_watchdog: up to 6.1, 6.2-6.6 (" %u ms"), 6.7+ (netdev_crit)
        (
            "NETDEV WATCHDOG: enp59s0f0np0 (mlx5_core): transmit queue 7 timed out",
            LinkEvent("tx_timeout", "enp59s0f0np0", None),
        ),
        (
            "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 0 timed out 5120 ms",
            LinkEvent("tx_timeout", "eth0", None),
        ),
        (
            "mlx5_core 0000:3b:00.0 enp59s0f0np0: NETDEV WATCHDOG: CPU: 12: transmit queue 3 timed out 5120 ms",
            LinkEvent("tx_timeout", "enp59s0f0np0", BUS),
        ),
    ],
)
def test_the_drivers_own_link_lines_are_link_events(line: str, event: LinkEvent) -> None:
    assert parse_link_line(line) == event


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:3b:00.0 enp59s0f0np0: Link up",
        "mlx5_core 0000:3b:00.0: port_module:254:(pid 0): Port module event: module 0, Cable plugged",
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        "IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
        "mlx5_core 0000:3b:00.0 averyveryverylongname0: Link down",  # not an interface name
        "mlx5_core 0000:3b:00.0 eth0;reboot: Link down",
        "eth0: Link down, and then " + "x" * 600,
        "",
    ],
)
def test_anything_else_is_not(line: str) -> None:
    assert parse_link_line(line) is None


def _mon(sysfs: FakeSysfs) -> LinkMonitor:
    mon = LinkMonitor(sysfs.root, CAT)
    assert mon.poll(1000.0) == []
    return mon


def _nic(sysfs: FakeSysfs, iface: str, bus: str = BUS) -> None:
    """An interface whose `device` links to its PCI function, as the kernel's sysfs has it."""
    sysfs.add_net(iface, physical=False, carrier_changes=2)
    pci = sysfs.root / "devices" / "pci0000:3a" / bus
    pci.mkdir(parents=True)
    os.symlink(pci, sysfs.root / "class" / "net" / iface / "device")


def _line(mon: LinkMonitor, text: str, at: float = 1000.5) -> None:
    event = parse_link_line(text)
    assert event is not None
    mon.kernel_event(event, at, at)


def test_link_lines_alone_reach_the_threshold_on_a_node_without_the_port_in_sysfs(sysfs: FakeSysfs) -> None:
    mon = _mon(sysfs)
    for _ in range(FLAP.threshold - 1):
        _line(mon, "ib0: Link down")
    assert mon.poll(1001.0) == []  # below the threshold: nothing
    _line(mon, "ib0: Link down", 1001.5)
    [found] = mon.poll(1002.0)
    assert (found.fault, found.device) == (FaultClass.LINK_FLAP, "kmsg/ib0")
    assert mon.poll(1002.0 + FLAP.window_seconds + 1) == []  # the window passes


def test_a_cable_event_names_the_interface_at_its_bus_id(sysfs: FakeSysfs) -> None:
    _nic(sysfs, "enp59s0f0np0")
    mon = _mon(sysfs)
    for _ in range(FLAP.threshold):
        _line(
            mon,
            "mlx5_core 0000:3b:00.0: port_module:254:(pid 0): Port module event: module 0, Cable unplugged",
        )
    [found] = mon.poll(1001.0)
    assert found.device == "net/enp59s0f0np0"


def test_one_flap_seen_by_the_counter_and_the_log_counts_once_even_a_poll_apart(sysfs: FakeSysfs) -> None:
    _nic(sysfs, "enp59s0f0np0")
    mon = _mon(sysfs)
    line = "mlx5_core 0000:3b:00.0 enp59s0f0np0: Link down"
    t = 1000.0
    for flaps in range(1, FLAP.threshold):
        t += 1.0
        sysfs.add_net("enp59s0f0np0", physical=False, carrier_changes=2 + 2 * flaps)
        if flaps % 2 == 0:  # the line in the same poll as the counter...
            _line(mon, line, t - 0.5)
            assert mon.poll(t) == []
        else:  # ...or the counter first and the line a poll later
            assert mon.poll(t) == []
            _line(mon, line, t + 0.5)
    assert mon.poll(t + 1.0) == []  # threshold - 1 flaps, each seen twice: still below
    assert sum(a for _, a in mon._flaps["net/enp59s0f0np0"].items) == FLAP.threshold - 1


def test_a_line_the_counters_never_match_still_counts_and_a_late_match_does_not_linger(
    sysfs: FakeSysfs,
) -> None:
    _nic(sysfs, "eth0")
    mon = _mon(sysfs)
    _line(mon, "NETDEV WATCHDOG: eth0 (mlx5_core): transmit queue 0 timed out 5120 ms")
    mon.poll(1001.0)  # a hung queue: a flap, though the carrier never dropped
    # long after, a carrier flap is a flap of its own (the credit expired)
    sysfs.add_net("eth0", physical=False, carrier_changes=4)
    mon.poll(1001.0 + CREDIT_SECONDS + 1)
    assert sum(a for _, a in mon._flaps["net/eth0"].items) == 2


def test_a_replayed_line_older_than_the_window_is_history(sysfs: FakeSysfs) -> None:
    mon = _mon(sysfs)
    event = parse_link_line("ib0: Link down")
    assert event is not None
    now = 5000.0
    for _ in range(FLAP.threshold):
        mon.kernel_event(event, now - FLAP.window_seconds - 10, now)
    assert mon.poll(now) == []


def test_the_watchers_reader_hands_link_lines_to_the_link_check(tmp_path: Path, sysfs: FakeSysfs) -> None:
    w = link_watcher(tmp_path, sysfs)
    try:
        now = time.time()
        assert w.poll_links(now) == 0
        for i in range(FLAP.threshold):
            w.handle(Line("mlx5_core 0000:3b:00.0 ib0: Link down", None, now + i))  # type: ignore[arg-type]
        assert w.poll_links(now + FLAP.threshold) == 1
        [entry] = w.outbox.due(now + 100, 10)
        assert entry.alert.labels["fault"] == "link_flap" and entry.alert.labels["device"] == "kmsg/ib0"
    finally:
        w.client.close()
