"""The watcher's parts on their own: the outbox (dedup, backoff, bound, persistence), the sources
(kmsg cursor, replay window, sequence gaps, a followed text log, the real /dev/kmsg), the GPU map."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from autoheal.kmsg import format_record
from watcher.alerts import WatchAlert
from watcher.gpus import Gpu, GpuMap, parse_smi_csv, read_procfs
from watcher.outbox import Outbox
from watcher.sources import FileSource, JournaldSource, KmsgSource


def alert(gpu: str, xid: str = "79", at: float = 1000.0) -> WatchAlert:
    return WatchAlert({"alertname": "GpuXidFatal", "gpu": gpu, "xid": xid}, {"message": "m"}, at)


def test_outbox_dedups_resends_and_backs_off():
    ob = Outbox(hold_seconds=60, resend_seconds=10, max_pending=16, retry_min=0.5, retry_max=4)
    assert ob.offer(alert("1"), 1000) == "new"
    assert [ob.offer(alert("1"), 1000 + i) for i in range(3)] == ["dedup"] * 3
    [e] = ob.due(1001, 10)
    assert ob.failed([e], 1001) == 0.5 and ob.due(1001.2, 10) == []
    assert ob.failed([e], 1001.5) == 1.0 and ob.failed([e], 1002) == 2.0
    assert ob.failed([e], 1003) == 4.0 and ob.failed([e], 1004) == 4.0  # capped
    ob.delivered([e], 1010)
    assert e.payload(60)["annotations"]["occurrences"] == "4"
    assert ob.offer(alert("1"), 1015) == "dedup"  # within the resend interval
    assert ob.offer(alert("1"), 1021) == "refresh"
    assert ob.pending() == 1


def test_outbox_bound_frees_finished_entries_and_counts_overflow():
    ob = Outbox(hold_seconds=60, resend_seconds=10, max_pending=16)
    for g in range(16):
        ob.offer(alert(str(g)), 1000)
    assert ob.offer(alert("new"), 1000) == "overflow" and ob.overflow == 1  # all undelivered: kept
    ob.delivered(ob.due(1000, 4), 1000)
    assert ob.offer(alert("new"), 1001) == "new"  # a delivered one made room
    assert len(ob) == 16 and ob.pending() == 13


def test_outbox_persists():
    ob = Outbox(60, 10, 16)
    ob.offer(alert("1"), 1000)
    ob.offer(alert("2"), 1000)
    ob.delivered(ob.due(1000, 1), 1000)
    again = Outbox(60, 10, 16)
    assert again.load([*ob.dump(), {"garbage": True}]) == 1
    assert len(again) == 2


def _kmsg(path: Path, records: list[tuple[int, int, str]]) -> None:
    with path.open("a") as fh:
        for seq, usec, msg in records:
            fh.write(format_record(seq, usec, msg))


def _take(source, n: int, timeout: float = 5.0) -> list:
    stop = threading.Event()
    out: list = []

    def run() -> None:
        for line in source.lines(stop):
            out.append(line)
            if len(out) >= n:
                break

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    stop.set()
    t.join(5)
    return out


def test_kmsg_file_replay_window_cursor_and_gaps(tmp_path: Path):
    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    log = tmp_path / "kmsg"
    now_us = int(time.monotonic() * 1e6)
    # kmsg stamps are microseconds since boot: "old" must stay positive on a machine booted a
    # minute ago (an hour back was negative there, and the record garbage), so the window is short
    _kmsg(
        log,
        [(0, now_us - 30_000_000, "old"), (1, now_us - 1_000_000, "recent"), (5, now_us, "after a gap")],
    )
    src = KmsgSource(log, None, boot, replay_seconds=5)
    lines = _take(src, 2)
    assert [x.message for x in lines] == ["recent", "after a gap"]  # the old record is not replayed
    assert src.stats.lost == 3 and src.stats.skipped == 1
    cursor = lines[-1].cursor
    _kmsg(log, [(6, now_us + 1, "new")])
    again = KmsgSource(log, cursor, boot, replay_seconds=60)
    assert [x.message for x in _take(again, 1)] == ["new"]
    # a new boot: the whole buffer of the new boot is read, whatever the cursor said
    boot.write_text("boot-b\n")
    assert len(_take(KmsgSource(log, cursor, boot, replay_seconds=60), 4)) == 4


def test_kmsg_file_replaced_is_a_new_log(tmp_path: Path):
    boot = tmp_path / "boot_id"
    boot.write_text("b")
    log = tmp_path / "kmsg"
    _kmsg(log, [(0, int(time.monotonic() * 1e6), "one")])
    [first] = _take(KmsgSource(log, None, boot, 60), 1)
    log.unlink()
    _kmsg(log, [(0, int(time.monotonic() * 1e6), "fresh")])  # a new file starts at seq 0 again
    assert [x.message for x in _take(KmsgSource(log, first.cursor, boot, 60), 1)] == ["fresh"]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable here")
def test_the_real_dev_kmsg_is_read_record_by_record(tmp_path: Path):
    """The device, as the DaemonSet reads it (read-only: the test writes nothing into it)."""
    src = KmsgSource(Path("/dev/kmsg"), None, Path("/proc/sys/kernel/random/boot_id"), replay_seconds=10**9)
    lines = _take(src, 5)
    assert len(lines) == 5 and src.stats.garbage == 0
    seqs = [x.cursor["seq"] for x in lines]
    assert seqs == sorted(seqs)
    assert all(x.wall_time is not None and x.wall_time <= time.time() + 1 for x in lines)
    # resuming after the third skips the first three
    again = KmsgSource(Path("/dev/kmsg"), lines[2].cursor, Path("/proc/sys/kernel/random/boot_id"), 10**9)
    assert _take(again, 1)[0].cursor["seq"] > seqs[2]


def test_text_log_followed_across_rotation(tmp_path: Path):
    log = tmp_path / "kern.log"
    log.write_text("Nov 30 12:00:00 gpu-2 kernel: before the watcher started\n")
    src = FileSource(log, None, poll_seconds=0.01)
    stop = threading.Event()
    got: list = []
    t = threading.Thread(target=lambda: got.extend(src.lines(stop)), daemon=True)
    t.start()
    time.sleep(0.2)
    with log.open("a") as fh:
        fh.write("Nov 30 12:00:01 gpu-2 kernel: [ 10.5] NVRM: one\nhalf a li")
    time.sleep(0.2)
    assert [x.message for x in got] == ["NVRM: one"]  # the partial line waits for its end
    log.rename(tmp_path / "kern.log.1")
    log.write_text("after rotation\n")
    deadline = time.monotonic() + 5
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    t.join(5)
    assert [x.message for x in got] == ["NVRM: one", "after rotation"]
    # restart from the saved cursor: nothing again
    assert _take(FileSource(log, got[-1].cursor, 0.01), 1, timeout=0.5) == []


def test_journald_entries_and_cursor_arguments():
    src = JournaldSource(None, replay_seconds=300)
    assert "--since=-300s" in src._argv()
    line = src._entry(
        b'{"__CURSOR":"s=abc;i=1","__REALTIME_TIMESTAMP":"1700000000000000",'
        b'"MESSAGE":"NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."}'
    )
    assert line is not None and line.wall_time == 1_700_000_000 and line.cursor["cursor"] == "s=abc;i=1"
    # journald gives a non-UTF-8 message as an array of bytes
    line = src._entry(b'{"__CURSOR":"c2","MESSAGE":[78,86,82,77,58,32,255]}')
    assert line is not None and line.message.startswith("NVRM: ")
    assert src._entry(b"not json") is None and src.stats.garbage == 1
    assert "--after-cursor=c2" in JournaldSource({"kind": "journald", "cursor": "c2"}, 300)._argv()


def test_gpu_map_from_nvidia_smi_csv_and_procfs(tmp_path: Path):
    m = parse_smi_csv(
        "0, 00000000:18:00.0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3\n"
        "1, 00000000:2A:00.0, garbage-uuid, $(evil)\nnot,a\nx, y, z\n"
    )
    assert m == {
        "0000:18:00": Gpu(0, "GPU-aaaaaaaa-1111-2222-3333-444444444444", None, "NVIDIA H100 80GB HBM3"),
        "0000:2a:00": Gpu(1, None),
    }
    for bus, minor in (("0000:9a:00.0", 5), ("0000:18:00.0", 0)):
        d = tmp_path / bus
        d.mkdir()
        (d / "information").write_text(
            f"Model: NVIDIA H100\nGPU UUID: GPU-{minor:08x}-1111-2222-3333-444444444444\n"
            f"Bus Location: {bus}\nDevice Minor: {minor}\n"
        )
    assert read_procfs(tmp_path) == {
        "0000:18:00": Gpu(0, "GPU-00000000-1111-2222-3333-444444444444", 0, "NVIDIA H100"),
        "0000:9a:00": Gpu(1, "GPU-00000005-1111-2222-3333-444444444444", 5, "NVIDIA H100"),
    }


def test_gpu_map_never_forgets_a_gpu(tmp_path: Path):
    csv = tmp_path / "gpus.csv"
    csv.write_text("0, 00000000:18:00.0, GPU-aaaaaaaa-1111-2222-3333-444444444444\n1, 00000000:2A:00.0, x\n")
    gm = GpuMap(f"file:{csv}")
    assert gm.refresh() == 2
    csv.write_text("0, 00000000:18:00.0, GPU-aaaaaaaa-1111-2222-3333-444444444444\n")  # GPU 1 fell off
    assert gm.refresh() == 2 and gm.get("0000:2a:00") == Gpu(1, None)
    gm.learn_uuid("0000:2a:00", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
    assert gm.get("0000:2a:00") == Gpu(1, "GPU-bbbbbbbb-1111-2222-3333-444444444444")
    csv.unlink()
    assert gm.refresh() == 2 and "No such file" in gm.last_error


def test_a_bad_command_line_names_the_option_and_exits_2(tmp_path: Path):
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "watcher",
            "--node=GPU_1",
            "--alertmanager=not a url",
            f"--state={tmp_path / 's'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stderr
    assert "--node: " in res.stderr and "not a valid node name" in res.stderr
    assert "--alertmanager: " in res.stderr
    assert "Traceback" not in res.stderr


def test_a_kernel_log_that_cannot_be_opened_stops_the_watcher_naming_why(tmp_path: Path):
    """What a pod without the device cgroup's leave sees (measured on the lab's real nodes:
    tests/nodes/test_xid_watcher_kmsg.py): EPERM on open, named with what it takes."""
    import errno

    from watcher import cli

    log = tmp_path / "kmsg"
    assert cli._refused(log) is None  # not there yet: the source waits for it
    log.write_text("")
    assert cli._refused(log) is None

    def refuse(path: Path, flags: int) -> int:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    assert cli._refused(log, refuse) == f"{log}: Operation not permitted"  # a file: no device hint
    if Path("/dev/kmsg").is_char_device():
        why = cli._refused(Path("/dev/kmsg"), refuse)
        assert why is not None and why.startswith("/dev/kmsg: Operation not permitted (")
        assert "privileged: true or a device plugin" in why and "CAP_SYSLOG" in why
