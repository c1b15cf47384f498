"""Driver lines as NVIDIA's driver prints them, and what is decoded from them (autoheal.xid_messages,
autoheal.kmsg). Hostile input never raises and never escapes its bounds."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from autoheal.kmsg import format_record, parse_record, strip_prefix
from autoheal.xid_messages import (
    MAX_TEXT,
    FallenOffBus,
    GpuAnnounce,
    RecoveryAction,
    Severity,
    SxidLine,
    XidDetail,
    XidLine,
    normalise_bus_id,
    parse_message,
)


def one(message: str):
    [event] = parse_message(message)
    return event


def test_xid_79_line():
    e = one("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.")
    assert e == XidLine("0000:3b:00", 79, "GPU has fallen off the bus.", 1234, "python3", XidDetail())


def test_older_driver_forms():
    assert one("NVRM: Xid (0000:01:00): 31, Ch 0000000b, engmask 00000120").xid == 31
    assert one("NVRM: Xid (PCI:0000:3f:00): 46").text == ""
    e = one("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
    assert (e.pid, e.process, e.text) == (None, None, "Graphics SM Warp Exception")


def test_xid_154_recovery_action():
    base = "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to "
    assert one(base + "0x1 (GPU Reset Required)").detail.recovery_action is RecoveryAction.GPU_RESET
    assert one(base + "0x2 (Node Reboot Required)").detail.recovery_action is RecoveryAction.NODE_REBOOT
    assert one(base + "0x4 (Drain and Reset)").detail.recovery_action is RecoveryAction.DRAIN_AND_RESET
    assert one(base + "0x0 (None)").detail.recovery_action is RecoveryAction.NONE
    # an unknown code is read from its words; unknown words decode to nothing
    assert one(base + "0x9 (Node Reboot Required)").detail.recovery_action is RecoveryAction.NODE_REBOOT
    assert one(base + "0x9 (Dance)").detail == XidDetail()


def test_nvlink5_subcodes_144_to_150():
    e = one(
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 "
        "(0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
    )
    assert e.detail == XidDetail(
        subcode="NETIR_LINK_EVT", severity=Severity.FATAL, link=9, intrinfo=0x025525C6, error_status=0
    )
    e = one("NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP  Nonfatal   XC1 i2 Link 17 (0x00000004 0x00000010)")
    assert (e.detail.subcode, e.detail.severity, e.detail.link, e.detail.error_status) == (
        "RLW_REMAP",
        Severity.NONFATAL,
        17,
        16,
    )
    # the same words on an XID outside 144-150 decode to nothing
    assert (
        one("NVRM: Xid (PCI:0018:01:00): 13, NETIR_LINK_EVT Fatal XC0 i0 Link 09 (0x1 0x2)").detail
        == XidDetail()
    )


def test_xid_74_link():
    e = one(
        "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, "
        "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"
    )
    assert e.detail == XidDetail(link=14)


def test_sxid_lines():
    assert one(
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)"
    ) == SxidLine(0, "0000:c3:00", 24007, Severity.FATAL, 28, "sourcetrack timeout error (First)")
    e = one(
        "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 MC TS crumbstore MCTO (First)"
    )
    assert (e.severity, e.link) == (Severity.NONFATAL, 46)
    e = one("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26008, SOE Watchdog error")
    assert (e.severity, e.link, e.text) == (None, None, "SOE Watchdog error")


def test_gpu_announce_and_fallen_off_the_bus():
    assert one("NVRM: GPU at PCI:0000:66:00: GPU-12345678-1234-5678-9abc-def012345678") == GpuAnnounce(
        "0000:66:00", "GPU-12345678-1234-5678-9abc-def012345678"
    )
    fallen = (
        "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "NVRM: fallen off the bus and is not responding to commands."
    )
    assert parse_message(fallen) == [FallenOffBus("0000:b3:00")]


def test_bus_ids_have_one_spelling():
    assert normalise_bus_id("00000000:3B:00.0") == "0000:3b:00"
    assert normalise_bus_id("0000:3b:00") == "0000:3b:00"
    assert normalise_bus_id("0001:AB:cd.0") == "0001:ab:cd"


def test_garbage_and_truncation():
    for junk in (
        "",
        "NVRM:",
        "NVRM: Xid",
        "NVRM: Xid (PCI:0000:3b",
        "NVRM: Xid (PCI:0000:66:00): abc, pid=1",
        "NVRM: Xid (PCI:0000:66:00): 1000, pid=1",  # not an XID number
        "NVRM: Xid (PCI:0000:66:00): 0",
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): ",
        "[Wed Dec 11 13:23:01 2024] Linux version 5.15.0-117-generic",
    ):
        assert parse_message(junk) == [], junk


def test_hostile_text_is_bounded_and_printable():
    evil = (
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=$(rm -rf /), {{ lookup('pipe','id') }}\x1b[31m\u202e"
        + "x" * 5000
    )
    e = one(evil)
    assert len(e.text) <= MAX_TEXT
    assert all(" " <= c <= "~" for c in e.text)
    assert e.process is not None and len(e.process) <= 64


def test_detail_round_trips_through_annotations_and_rejects_forgeries():
    d = XidDetail(RecoveryAction.NODE_REBOOT, "NETIR_LINK_EVT", Severity.FATAL, 9, 123, 0)
    assert XidDetail.from_annotations(d.to_annotations()) == d
    forged = {
        "xid_recovery_action": "rm -rf",
        "xid_subcode": "{{ evil }}",
        "xid_severity": "FATAL",
        "xid_link": "99999",
        "xid_intrinfo": "-1",
    }
    assert XidDetail.from_annotations(forged) == XidDetail()


def test_kmsg_records():
    r = parse_record(
        "6,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n SUBSYSTEM=pci\n"
    )
    assert (r.seq, r.usec, r.level, r.facility) == (1234, 5678901, 6, 0)
    assert r.message.startswith("NVRM: Xid")
    assert parse_record("12,7,1,c;continued").continuation
    for bad in ("", "x", "1,2;msg", "a,b,c,-;msg", "6,1,2,-", "6,1,2,-;" + "a" * 5000):
        assert parse_record(bad) is None


def test_kmsg_escaping_round_trips():
    msg = "back\\slash \x01 tab\t é \u202e"
    assert parse_record(format_record(3, 9, msg)).message == msg
    assert "\\x5c" in format_record(3, 9, "\\")


def test_text_log_prefixes():
    assert strip_prefix("[ 1843.308145] NVRM: Xid (x)") == ("NVRM: Xid (x)", 1843308145)
    assert strip_prefix("Nov 30 12:00:01 gpu-2 kernel: [  12.5] NVRM: hi\n") == ("NVRM: hi", 12500000)
    assert strip_prefix("2026-11-30T12:00:01.123+00:00 gpu-2 kernel: NVRM: hi") == ("NVRM: hi", None)
    assert strip_prefix("plain") == ("plain", None)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=string.printable + "\x00\x1b\u202eé:()[],;=", max_size=600))
def test_any_text_never_raises(text):
    for e in parse_message("NVRM: Xid (PCI:0000:3b:00): " + text) + parse_message(text):
        if isinstance(e, XidLine):
            assert 0 < e.xid < 1000 and len(e.text) <= MAX_TEXT
    parse_record(text)
    strip_prefix(text)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_never_raise(data):
    rec = parse_record(data)
    if rec is not None:
        parse_message(rec.message)
