"""Degraded links from sysfs (issue 36): flaps, NIC error counters, PCIe downtraining - thresholds,
windows, counters that reset or wrap, nodes without InfiniBand - on a fake sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoheal.faults import FaultClass, load_fault_catalog
from lab.sysfs import FakeSysfs
from tests.watcher.conftest import link_watcher
from watcher.links import LinkMonitor, degraded_alert, parse_speed

CAT = load_fault_catalog()
FLAP = CAT.require(FaultClass.LINK_FLAP)
ERRS = CAT.require(FaultClass.NIC_ERRORS)
PCIE = CAT.require(FaultClass.PCIE_DOWNTRAINED)


def _mon(sysfs: FakeSysfs) -> LinkMonitor:
    mon = LinkMonitor(sysfs.root, CAT)
    assert mon.poll(1000.0) == []  # the first poll learns the counters
    return mon


def _faults(found: list) -> set[tuple[FaultClass, str]]:
    return {(f.fault, f.device) for f in found}


def test_flaps_below_the_threshold_alert_nothing_and_at_it_alert_once_per_port(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port("mlx5_0", 1)
    sysfs.add_ib_port("mlx5_1", 1)
    mon = _mon(sysfs)
    for i in range(FLAP.threshold - 1):
        sysfs.flap("mlx5_0", 1)
        assert mon.poll(1001.0 + i) == []
    sysfs.flap("mlx5_0", 1)
    found = mon.poll(1010.0)
    assert _faults(found) == {(FaultClass.LINK_FLAP, "mlx5_0/1")}
    assert f"{FLAP.threshold} flap(s) of mlx5_0/1" in found[0].detail
    # still within the window: the fault holds; past it with no new flap: gone
    assert _faults(mon.poll(1011.0)) == {(FaultClass.LINK_FLAP, "mlx5_0/1")}
    assert mon.poll(1010.0 + FLAP.window_seconds + 5) == []


def test_flaps_spread_wider_than_the_window_never_add_up(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port()
    mon = _mon(sysfs)
    t = 1000.0
    for _ in range(FLAP.threshold * 3):
        t += FLAP.window_seconds / (FLAP.threshold - 1) + 1
        sysfs.flap()
        assert mon.poll(t) == []


def test_a_port_going_down_counts_once_not_once_per_file(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port()
    mon = _mon(sysfs)
    # the kernel writes both: the state word and link_downed + 1 for one event
    sysfs.set_state("mlx5_0", 1, active=False)
    sysfs.flap()
    assert mon.poll(1001.0) == []
    sysfs.set_state("mlx5_0", 1, active=True)
    assert mon.poll(1002.0) == []
    assert sum(a for _, a in mon._flaps["mlx5_0/1"].items) == 1


def test_counters_that_reset_or_wrap_raise_no_false_alert(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port(link_downed=250, symbol_error=65530, port_rcv_errors=4_000_000_000)
    mon = _mon(sysfs)
    # perfquery -x -R / a driver reload: everything back to 0; a 16-bit counter wrapping
    sysfs.set_counter("mlx5_0", 1, "link_downed", 0)
    sysfs.set_counter("mlx5_0", 1, "symbol_error", 3)
    sysfs.set_counter("mlx5_0", 1, "port_rcv_errors", 0)
    assert mon.poll(1001.0) == []
    # counting goes on from the new base
    sysfs.set_counter("mlx5_0", 1, "link_downed", 1)
    assert mon.poll(1002.0) == []
    assert sum(a for _, a in mon._flaps["mlx5_0/1"].items) == 1


def test_a_16_bit_counter_that_wraps_mid_window_neither_alerts_nor_loses_the_flaps_before(
    sysfs: FakeSysfs,
) -> None:
    """symbol_error is 16 bits (the IB spec's PortCounters): 65535 -> 4 is a wrap, not 65531
    errors lost or gained; flaps seen before the wrap still count toward the window."""
    sysfs.add_ib_port(link_downed=253, symbol_error=65530)
    mon = _mon(sysfs)
    sysfs.set_counter("mlx5_0", 1, "link_downed", 254)  # one flap (8-bit counter)
    assert mon.poll(1001.0) == []
    sysfs.set_counter("mlx5_0", 1, "link_downed", 1)  # wrapped past 255: no flap counted, none lost
    sysfs.set_counter("mlx5_0", 1, "symbol_error", 4)
    assert mon.poll(1002.0) == []
    sysfs.set_counter("mlx5_0", 1, "link_downed", 1 + FLAP.threshold - 1)
    assert _faults(mon.poll(1003.0)) == {(FaultClass.LINK_FLAP, "mlx5_0/1")}  # 1 + (threshold - 1)


def test_carrier_counters_that_reset_raise_no_false_alert(sysfs: FakeSysfs) -> None:
    """A driver reload or a NIC reset zeroes an interface's carrier counters."""
    sysfs.add_net("eth0", carrier_changes=40)
    mon = _mon(sysfs)
    sysfs.add_net("eth0", carrier_changes=0)
    assert mon.poll(1001.0) == []
    sysfs.add_net("eth0", carrier_changes=2)  # one real flap after the reset
    assert mon.poll(1002.0) == []
    assert sum(a for _, a in mon._flaps["net/eth0"].items) == 1


def test_a_port_that_vanishes_and_returns_is_learnt_afresh(sysfs: FakeSysfs) -> None:
    """mlx5 unbound and bound again (a firmware reset): the port's files go and come back with
    fresh counters; its first poll back learns them, as at start."""
    import shutil

    sysfs.add_ib_port(link_downed=90, symbol_error=5000)
    mon = _mon(sysfs)
    shutil.rmtree(sysfs.root / "class" / "infiniband")
    assert mon.poll(1001.0) == []
    sysfs.add_ib_port(link_downed=95, symbol_error=5000 + 10 * ERRS.threshold)  # more than before
    assert mon.poll(1002.0) == []  # learnt, not compared with the port before it vanished
    sysfs.flap(times=FLAP.threshold)
    assert _faults(mon.poll(1003.0)) == {(FaultClass.LINK_FLAP, "mlx5_0/1")}


def test_a_counter_file_that_goes_missing_or_turns_to_garbage_counts_nothing(sysfs: FakeSysfs) -> None:
    port = sysfs.add_ib_port(link_downed=3)
    mon = _mon(sysfs)
    (port / "counters" / "link_downed").unlink()
    assert mon.poll(1001.0) == []
    (port / "counters" / "link_downed").write_text("N/A\n")
    assert mon.poll(1002.0) == []
    sysfs.set_counter("mlx5_0", 1, "link_downed", 3 + FLAP.threshold)  # readable again: a new base
    assert mon.poll(1003.0) == []


def test_climbing_error_counters_alert_nic_errors(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port(symbol_error=7)
    mon = _mon(sysfs)
    half = ERRS.threshold // 2
    sysfs.set_counter("mlx5_0", 1, "symbol_error", 7 + half)
    assert mon.poll(1001.0) == []
    sysfs.set_counter("mlx5_0", 1, "port_rcv_errors", ERRS.threshold - half)
    assert _faults(mon.poll(1002.0)) == {(FaultClass.NIC_ERRORS, "mlx5_0/1")}


def test_a_node_without_infiniband_or_without_sysfs_is_fine(tmp_path: Path, sysfs: FakeSysfs) -> None:
    assert LinkMonitor(tmp_path / "nothing-here", CAT).poll(1.0) == []
    sysfs.add_net("eth0")
    mon = _mon(sysfs)
    assert mon.poll(1001.0) == []


def test_the_watcher_of_a_node_with_no_infiniband_at_all_offers_nothing_and_logs_no_error(
    tmp_path: Path, sysfs: FakeSysfs, caplog: pytest.LogCaptureFixture
) -> None:
    """An Ethernet-only node (no class/infiniband, no NVIDIA or network PCIe device): the link
    check runs, finds nothing to judge and is quiet - no alert, no error, on every poll."""
    sysfs.add_net("eth0", carrier_changes=6)
    sysfs.add_net("lo", physical=False)
    w = link_watcher(tmp_path, sysfs, node="cpu-1")
    try:
        assert [w.poll_links(1000.0 + i) for i in range(5)] == [0] * 5
        assert len(w.outbox) == 0
        assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
    finally:
        w.client.close()


def test_physical_interfaces_flap_on_their_carrier_virtual_ones_are_ignored(sysfs: FakeSysfs) -> None:
    sysfs.add_net("eth0", carrier_changes=2)
    sysfs.add_net("veth1234", physical=False, carrier_changes=2)
    mon = _mon(sysfs)
    n = FLAP.threshold
    sysfs.add_net("eth0", carrier_changes=2 + 2 * n)
    sysfs.add_net("veth1234", physical=False, carrier_changes=2 + 2 * n)
    assert _faults(mon.poll(1001.0)) == {(FaultClass.LINK_FLAP, "net/eth0")}


def test_a_pcie_link_below_its_maximum_alerts_once_sustained(sysfs: FakeSysfs) -> None:
    sysfs.add_pci("0000:18:00.0")  # a GPU at x16 gen5
    sysfs.add_pci("0000:3b:00.0", gpu=False)  # a ConnectX
    sysfs.add_pci("0000:00:1f.0", gpu=False)
    (sysfs.root / "bus/pci/devices/0000:00:1f.0/class").write_text("0x060100\n")  # an ISA bridge
    sysfs.set_link("0000:00:1f.0", width=1)
    mon = _mon(sysfs)
    sysfs.set_link("0000:18:00.0", width=8)
    sysfs.set_link("0000:3b:00.0", speed="16.0 GT/s PCIe")
    assert mon.poll(1001.0) == []
    assert mon.poll(1001.0 + PCIE.sustain_seconds - 1) == []
    found = mon.poll(1001.0 + PCIE.sustain_seconds)
    assert _faults(found) == {
        (FaultClass.PCIE_DOWNTRAINED, "0000:18:00.0"),
        (FaultClass.PCIE_DOWNTRAINED, "0000:3b:00.0"),
    }
    assert "x8 of x16" in next(f.detail for f in found if f.device == "0000:18:00.0")
    # retrained: quiet at once, and a new downtraining waits its sustain again
    sysfs.set_link("0000:18:00.0", width=16)
    sysfs.set_link("0000:3b:00.0", speed="32.0 GT/s PCIe")
    assert mon.poll(2000.0) == []
    sysfs.set_link("0000:18:00.0", width=8)
    assert mon.poll(2001.0) == []


def test_unknown_or_garbage_link_values_are_not_a_fault(sysfs: FakeSysfs) -> None:
    sysfs.add_pci("0000:18:00.0")
    mon = _mon(sysfs)
    sysfs.set_link("0000:18:00.0", width=0, speed="Unknown")
    (sysfs.root / "bus/pci/devices/0000:18:00.0/max_link_width").write_text("sixteen\n")
    assert mon.poll(1001.0) == []
    assert mon.poll(1001.0 + PCIE.sustain_seconds + 1) == []
    assert parse_speed("2.5 GT/s PCIe") == 2.5
    assert parse_speed("8 GT/s") == 8.0
    assert parse_speed("Unknown") is None
    assert parse_speed(None) is None


def test_the_alert_carries_the_rules_labels_and_the_catalogue_version(sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port()
    mon = _mon(sysfs)
    sysfs.flap(times=FLAP.threshold)
    [finding] = mon.poll(1001.0)
    alert = degraded_alert("gpu-2", finding, CAT, 1001.0)
    assert alert is not None
    assert alert.labels == {
        "alertname": "NodeDegraded",
        "severity": "warning",
        "tier": "drain",
        "fault": "link_flap",
        "Hostname": "gpu-2",
        "device": "mlx5_0/1",
        "source": "watcher",
    }
    assert alert.annotations["fault_catalog_version"] == str(CAT.version)


def test_the_watcher_offers_one_alert_per_fault_into_its_outbox(tmp_path: Path, sysfs: FakeSysfs) -> None:
    sysfs.add_ib_port()
    w = link_watcher(tmp_path, sysfs)
    try:
        assert w.poll_links(1000.0) == 0
        sysfs.flap(times=FLAP.threshold)
        assert w.poll_links(1001.0) == 1
        assert w.poll_links(1002.0) == 1  # the same alert again: one outbox entry
        assert len(w.outbox) == 1
        [entry] = w.outbox.due(1003.0, 10)
        assert entry.alert.labels["fault"] == "link_flap" and entry.count == 2
    finally:
        w.client.close()


def test_a_flapping_port_reaches_the_runners_webhook_through_alertmanager(
    am, tmp_path: Path, sysfs: FakeSysfs, watcher_factory
) -> None:
    """The watcher process, a fake sysfs, the real Alertmanager with the shipped route, a sink where
    the runner stands: one flap says nothing; the threshold's flaps arrive as NodeDegraded."""
    import time

    from tests.watcher.conftest import KmsgFile

    sysfs.add_ib_port()
    sysfs.add_pci("0000:18:00.0")
    kmsg = KmsgFile(tmp_path / "kmsg")
    watcher_factory(am.url, kmsg.path, f"--sysfs-root={sysfs.root}", "--link-poll-seconds=0.2")
    time.sleep(1.0)  # learnt
    t0 = time.time()
    sysfs.flap()
    time.sleep(2.0)
    assert am.alerts(alertname="NodeDegraded") == []
    sysfs.flap(times=FLAP.threshold - 1)
    d = am.sink.wait_for({"alertname": "NodeDegraded", "Hostname": "gpu-2"}, 15, since=t0)
    [alert] = d.payload["alerts"]
    assert alert["labels"]["fault"] == "link_flap"
    assert alert["labels"]["tier"] == "drain"
    assert alert["labels"]["device"] == "mlx5_0/1"
    print(f"flap -> webhook {d.at - t0:.2f}s")


def test_the_simulators_nodes_have_a_sysfs_it_flaps_and_downtrains(tmp_path: Path) -> None:
    """lab.simulator writes what the lab's watchers read: a node's tree at boot, a flapped port
    and a GPU's PCIe link retrained narrower."""
    from lab.simulator import Fleet

    fleet = Fleet(2, kmsg_dir=tmp_path / "gpunodes")
    fleet.set_nodes({"gpu-1": "m"})
    mon = LinkMonitor(tmp_path / "gpunodes" / "gpu-1" / "sys", CAT)
    assert mon.poll(1000.0) == []
    fleet.flap_link("gpu-1", FLAP.threshold)
    fleet.pcie_width("gpu-1", 1, 8)
    found = _faults(mon.poll(1001.0) + mon.poll(1001.0 + PCIE.sustain_seconds))
    assert (FaultClass.LINK_FLAP, "mlx5_0/1") in found
    assert (FaultClass.PCIE_DOWNTRAINED, "0000:2a:00.0") in found


def test_the_simulator_exports_throttle_reasons_and_a_pending_remap_a_reset_applies() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from lab.simulator import Fleet

    def value(fleet: Fleet, metric: str, node: str, gpu: int) -> float:
        reg = CollectorRegistry()
        reg.register(fleet)
        fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
        [s] = [
            s for s in fams[metric].samples if s.labels["Hostname"] == node and s.labels["gpu"] == str(gpu)
        ]
        return float(s.value)

    fleet = Fleet(4)
    fleet.set_nodes({"gpu-1": "m"})
    assert value(fleet, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu-1", 2) == 0
    fleet.gpu_state("gpu-1", 2, 0x40, True)
    assert value(fleet, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu-1", 2) == 0x40
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_PENDING", "gpu-1", 2) == 1
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_PENDING", "gpu-1", 1) == 0
    fleet.reset("gpu-1", 2)  # a reset applies the remap; throttling is the GPU's heat, not reset
    assert value(fleet, "DCGM_FI_DEV_ROW_REMAP_PENDING", "gpu-1", 2) == 0
    assert value(fleet, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu-1", 2) == 0x40
    fleet.clear("gpu-1", None)
    assert value(fleet, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gpu-1", 2) == 0
