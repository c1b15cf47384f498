"""The watcher against the real Alertmanager: a kernel line becomes the alert the rules would
raise, delivered to the webhook; masked XIDs, garbage, floods, an Alertmanager outage and restarts
change none of that."""

from __future__ import annotations

import time

import pytest

from tests.support import wait_for
from tests.watcher.conftest import Am, KmsgFile, bus, start_alertmanager, stop

pytestmark = pytest.mark.timeout(180)


def _xid(i: int, xid: int, text: str) -> str:
    return f"NVRM: Xid (PCI:{bus(i)}): {xid}, pid=4242, name=python3, {text}"


def test_xid_79_reaches_the_webhook_with_the_rules_labels(am: Am, tmp_path, watcher_factory):
    kmsg = KmsgFile(tmp_path / "kmsg")
    watcher_factory(am.url, kmsg.path)
    t0 = time.time()
    kmsg.write(_xid(3, 79, "GPU has fallen off the bus."))
    d = am.sink.wait_for({"Hostname": "gpu-2", "gpu": "3", "xid": "79"}, 10, since=t0)
    assert d.at - t0 < 2.0, f"kernel line -> webhook took {d.at - t0:.2f}s"
    [alert] = [a for a in d.payload["alerts"] if a["labels"].get("source") == "watcher"]
    labels = alert["labels"]
    assert labels["alertname"] == "GpuXidFatal"
    assert (labels["severity"], labels["tier"]) == ("critical", "reboot")
    assert labels["UUID"] == "GPU-00000003-1111-2222-3333-000000000003"
    assert labels["pci_bus_id"] == bus(3)
    assert alert["annotations"]["message"] == "GPU has fallen off the bus."
    assert alert["annotations"]["summary"] == "Fatal XID 79 on gpu-2 GPU 3"


def test_masked_xid_79_then_13_is_still_caught(am: Am, tmp_path, watcher_factory):
    """The gauge would end at 13 (restart_app) before any scrape; the kernel log keeps both lines."""
    kmsg = KmsgFile(tmp_path / "kmsg")
    w = watcher_factory(am.url, kmsg.path)
    t0 = time.time()
    kmsg.write(_xid(5, 79, "GPU has fallen off the bus."), _xid(5, 13, "Graphics SM Warp Exception"))
    am.sink.wait_for({"Hostname": "gpu-2", "gpu": "5", "xid": "79"}, 10, since=t0)
    wait_for(
        lambda: w.metric('autoheal_watcher_events_total{code="13",kind="xid"}') == 1, 5, "XID 13 counted"
    )
    # 13 is an application error: posted on its own rung (restart the job; the node stays in service)
    am.sink.wait_for({"Hostname": "gpu-2", "gpu": "5", "xid": "13"}, 10, since=t0)
    assert {a["labels"]["tier"] for a in am.alerts(xid="13")} == {"restart_app"}


def test_garbage_truncated_interleaved_unknown_and_unmapped(am: Am, tmp_path, watcher_factory):
    kmsg = KmsgFile(tmp_path / "kmsg")
    w = watcher_factory(am.url, kmsg.path)
    t0 = time.time()
    kmsg.write(
        "NVRM: Xid (PCI:0000:3b",  # truncated
        "NVRM: Xid (PCI:0000:28:00): abc, pid=1",  # not a number
        "NVRM: Xid (PCI:0000:28:00): 999, pid=1, an XID nobody knows",  # unknown: fails safe
        "\x00\x01\x02 NVRM: \x7f\xff",  # control bytes
        "NVRM: Xid (PCI:0000:38:00): 48, pid=NVRM: Xid (PCI:0000:48:00): 79, pid=7, name=x, GPU has fallen off",
        _xid(9, 79, "GPU has fallen off the bus."),  # bus 0000:a8:00 is no GPU of this node
        "A" * 3000,
    )
    # garbage between records: not even a kmsg record
    kmsg.write(raw=b"this is not a record\n;;;\n\xff\xfe\n")
    kmsg.write(_xid(0, 48, "An uncorrectable double bit error (DBE) has been detected"))
    am.sink.wait_for({"gpu": "0", "xid": "48"}, 10, since=t0)
    # the interleaved line carried two events: 48 on GPU 2 and 79 on GPU 3
    am.sink.wait_for({"gpu": "2", "xid": "48"}, 10, since=t0)
    am.sink.wait_for({"gpu": "3", "xid": "79"}, 10, since=t0)
    unmapped = am.sink.wait_for({"pci_bus_id": "0000:a8:00", "xid": "79"}, 10, since=t0)
    [a] = [x for x in unmapped.payload["alerts"] if x["labels"].get("pci_bus_id") == "0000:a8:00"]
    assert "gpu" not in a["labels"] and "not in this node's GPU map" in a["annotations"]["summary"]
    # an XID the catalogue does not know is quarantined (fence + page), never silently notified
    am.sink.wait_for({"xid": "999"}, 10, since=t0)
    assert {a["labels"]["tier"] for a in am.alerts(xid="999")} == {"quarantine"}
    wait_for(lambda: w.metric("autoheal_watcher_records_garbage") >= 3, 5, "garbage counted")
    assert w.proc.poll() is None


def test_a_flood_is_one_alert_and_no_crash(am: Am, tmp_path, watcher_factory):
    """One faulty GPU printing thousands of lines a second: one alert per fault, a handful of posts."""
    kmsg = KmsgFile(tmp_path / "kmsg")
    w = watcher_factory(am.url, kmsg.path)
    t0 = time.time()
    lines = [_xid(4, 79, f"GPU has fallen off the bus. ({n})") for n in range(5000)]
    lines += [_xid(4, 13, f"Graphics Exception {n}") for n in range(5000)]
    kmsg.write(*lines)
    am.sink.wait_for({"gpu": "4", "xid": "79"}, 10, since=t0)
    wait_for(lambda: w.metric("autoheal_watcher_records_read") >= 10000, 60, "the flood to be read")
    took = time.time() - t0
    # one alert per fault (79, and 13 on its restart_app rung), each flood deduplicated
    wait_for(lambda: w.metric("autoheal_watcher_alerts_posted_total") == 2, 10, "both alerts posted")
    assert w.metric('autoheal_watcher_alerts_offered_total{outcome="dedup"}') == 2 * 4999
    assert len(am.alerts(xid="79")) == 1
    print(f"10,000 lines read and handled in {took:.2f}s")


def test_alertmanager_down_then_back_loses_nothing(am: Am, tmp_path, watcher_factory):
    kmsg = KmsgFile(tmp_path / "kmsg")
    w = watcher_factory(am.url, kmsg.path)
    stop(am.proc)
    kmsg.write(*[_xid(g, 79, "GPU has fallen off the bus.") for g in range(8)])
    wait_for(lambda: w.metric("autoheal_watcher_post_errors_total") >= 2, 15, "failed posts")
    assert w.metric("autoheal_watcher_alertmanager_up") == 0
    wait_for(lambda: w.metric("autoheal_watcher_alerts_pending") == 8, 5, "8 alerts waiting")
    t0 = time.time()
    am.proc = start_alertmanager(tmp_path / "am", am.port, am.sink.port)
    for g in range(8):
        am.sink.wait_for({"gpu": str(g), "xid": "79"}, 30, since=t0)
    wait_for(lambda: w.metric("autoheal_watcher_alertmanager_up") == 1, 5, "alertmanager_up")
    wait_for(lambda: w.metric("autoheal_watcher_alerts_pending") == 0, 5, "nothing pending")


def test_restart_does_not_repost_old_lines_and_keeps_undelivered(am: Am, tmp_path, watcher_factory):
    kmsg = KmsgFile(tmp_path / "kmsg")
    w = watcher_factory(am.url, kmsg.path)
    t0 = time.time()
    kmsg.write(_xid(1, 79, "GPU has fallen off the bus."))
    am.sink.wait_for({"gpu": "1", "xid": "79"}, 10, since=t0)
    time.sleep(0.5)  # the state is saved every 0.2 s
    w.proc.kill()  # no goodbye: the saved state is all it has
    w.proc.wait()
    # while it is down: Alertmanager goes down too, and a new fault is logged
    stop(am.proc)
    kmsg.write(_xid(6, 48, "An uncorrectable double bit error (DBE) has been detected"))
    w2 = watcher_factory(am.url, kmsg.path)
    wait_for(lambda: w2.metric("autoheal_watcher_alerts_pending") == 1, 10, "the new fault to wait")
    w2.proc.kill()  # killed again before it could deliver: the alert is in its state
    w2.proc.wait()
    am.proc = start_alertmanager(tmp_path / "am", am.port, am.sink.port)
    t1 = time.time()
    w3 = watcher_factory(am.url, kmsg.path)
    am.sink.wait_for({"gpu": "6", "xid": "48"}, 15, since=t1)
    time.sleep(2)
    assert w3.metric("autoheal_watcher_records_read") == 0  # nothing old was handled again
    assert w3.metric("autoheal_watcher_records_skipped") == 2
    reposted = [
        d
        for d in am.sink.deliveries
        if d.at >= t1
        for a in d.payload["alerts"]
        if a["labels"].get("gpu") == "1"
    ]
    assert not reposted
