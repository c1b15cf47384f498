"""Where kernel log lines come from: /dev/kmsg (or a file of kmsg records), journald, a text file.

Each source yields `Line`s carrying a cursor: the position just after that line, saved with the
watcher's state so a restart resumes after the last line it handled instead of re-posting old ones.

- kmsg: a record's sequence number grows by one per record within a boot; the cursor is the boot
  id (or, for a regular file, its inode) plus the last sequence number. A gap in sequence numbers
  means the ring buffer overwrote records before we read them: counted as lost, never silent.
  With no saved state at all, only the last `replay_seconds` of the buffer are read, so a first
  deployment does not alert on faults remediated hours ago; after a reboot (a new boot id) the whole
  buffer of the new boot is read.
- journald: `journalctl -k -f -o json`, resumed with `--after-cursor`.
- file: a text log (syslog, a dmesg dump) followed like `tail -F`; the cursor is inode + offset. A
  first start begins at the end (text logs carry no sequence to bound a replay by).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import select
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoheal.kmsg import parse_record, strip_prefix

log = logging.getLogger(__name__)
Cursor = dict[str, Any]
READ_CHUNK = 65536
MAX_LINE = 16384  # a text line longer than this is garbage: cut, never buffered without bound


@dataclass(frozen=True)
class Line:
    message: str
    cursor: Cursor  # where to resume after this line
    wall_time: float | None = None  # when the kernel logged it (epoch seconds), if the source says


@dataclass
class SourceStats:
    """What a source saw, for the watcher's metrics."""

    records: int = 0  # records handed on to be parsed
    skipped: int = 0  # records behind the saved cursor (handled before a restart) or the replay window
    lost: int = 0  # records the kernel overwrote (kmsg) before we could read them
    garbage: int = 0  # records that did not parse as records at all
    up: bool = False  # the source is open and being read
    errors: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors = [*self.errors[-4:], text]


class Source(Protocol):
    stats: SourceStats

    def lines(self, stop: threading.Event) -> Iterator[Line]: ...


def boot_id(path: Path) -> str:
    try:
        return path.read_text().strip()[:64]
    except OSError:
        return "unknown"


def monotonic_to_wall(usec: int) -> float:
    """Wall-clock time of a kernel timestamp (microseconds of CLOCK_MONOTONIC since boot)."""
    return time.time() - (time.monotonic() - usec / 1e6)


class KmsgSource:
    """/dev/kmsg, or a regular file holding kmsg records (the lab's simulated nodes write one)."""

    def __init__(
        self,
        path: Path,
        cursor: Cursor | None,
        boot_id_file: Path,
        replay_seconds: float,
        poll_seconds: float = 0.02,
    ) -> None:
        self.path = path
        self.saved = cursor if cursor and cursor.get("kind") == "kmsg" else None
        self.boot_id_file = boot_id_file
        self.replay_seconds = replay_seconds
        self.poll_seconds = poll_seconds
        self.stats = SourceStats()

    def _identity(self, fd: int, st: os.stat_result, stop: threading.Event) -> str | None:
        """Whose sequence numbers these are: the boot for the device; for a regular file also its
        first record (inode numbers are reused at once when a file is recreated; a first record
        carries its own timestamp). None if `stop` is set before a regular file has a record."""
        ident = boot_id(self.boot_id_file)
        if stat.S_ISCHR(st.st_mode):
            return ident
        while not stop.is_set():
            head = os.pread(fd, 4096, 0)
            if b"\n" in head:
                first = head.split(b"\n", 1)[0]
                return f"{ident}/{hashlib.sha256(first).hexdigest()[:16]}"
            stop.wait(self.poll_seconds)
        return None

    def lines(self, stop: threading.Event) -> Iterator[Line]:
        while not stop.is_set():
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                self.stats.up = False
                self.stats.error(f"{self.path}: {exc.strerror}")
                stop.wait(1.0)
                continue
            try:
                st = os.fstat(fd)
                ident = self._identity(fd, st, stop)
                if ident is None:
                    return
                self.stats.up = True
                reader = self._device if stat.S_ISCHR(st.st_mode) else self._file
                yield from self._filter(reader(fd, stop), ident)
            finally:
                os.close(fd)
                self.stats.up = False

    def _filter(self, raws: Iterator[str], ident: str) -> Iterator[Line]:
        """Parse records; skip those handled before (same identity, seq not newer) and, on a first
        start, those older than the replay window; count gaps."""
        same = self.saved is not None and self.saved.get("identity") == ident
        last_seq = int(self.saved.get("seq", -1)) if same and self.saved else -1
        oldest_usec = None
        if self.saved is None:
            oldest_usec = int((time.monotonic() - self.replay_seconds) * 1e6)
        prev: int | None = None
        for raw in raws:
            rec = parse_record(raw)
            if rec is None:
                self.stats.garbage += 1
                continue
            if prev is not None and rec.seq > prev + 1:
                self.stats.lost += rec.seq - prev - 1
            prev = rec.seq
            if rec.seq <= last_seq or (oldest_usec is not None and rec.usec < oldest_usec):
                self.stats.skipped += 1
                continue
            self.stats.records += 1
            cursor = {"kind": "kmsg", "identity": ident, "seq": rec.seq}
            self.saved = cursor  # a reopen (a read error, a replaced file) resumes from here
            yield Line(rec.message, cursor, monotonic_to_wall(rec.usec))

    def _device(self, fd: int, stop: threading.Event) -> Iterator[str]:
        """/dev/kmsg: one record per read(2); EAGAIN when drained; EPIPE when records were
        overwritten (the next read continues with the oldest record still there)."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not stop.is_set():
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                poller.poll(500)
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # the sequence gap is counted in _filter
                raise
            if not data:
                return
            yield data.decode("utf-8", errors="replace")

    def _file(self, fd: int, stop: threading.Event) -> Iterator[str]:
        """A regular file of records, followed as it grows; a record's dictionary lines (they
        start with a space) are dropped."""
        buf = b""
        while not stop.is_set():
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                if self._replaced(fd):
                    return  # reopened by lines(): a new file is a new log
                stop.wait(self.poll_seconds)
                continue
            buf += chunk
            *complete, buf = buf.split(b"\n")
            if len(buf) > MAX_LINE:
                buf = b""
                self.stats.garbage += 1
            for raw in complete:
                if raw and not raw.startswith(b" "):
                    yield raw.decode("utf-8", errors="replace")

    def _replaced(self, fd: int) -> bool:
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        st = os.fstat(fd)
        return (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)


class FileSource:
    """A text log followed like `tail -F` (syslog's kern.log, a dmesg dump being appended to)."""

    def __init__(self, path: Path, cursor: Cursor | None, poll_seconds: float = 0.02) -> None:
        self.path = path
        self.saved = cursor if cursor and cursor.get("kind") == "file" else None
        self.poll_seconds = poll_seconds
        self.stats = SourceStats()

    def lines(self, stop: threading.Event) -> Iterator[Line]:
        first = True
        while not stop.is_set():
            try:
                fh = self.path.open("rb")
            except OSError as exc:
                self.stats.up = False
                self.stats.error(f"{self.path}: {exc.strerror}")
                stop.wait(1.0)
                first = False  # whatever appears later is new
                continue
            with fh:
                st = os.fstat(fh.fileno())
                inode = f"{st.st_dev}:{st.st_ino}"
                if self.saved and self.saved.get("inode") == inode and st.st_size >= self.saved["offset"]:
                    fh.seek(int(self.saved["offset"]))
                elif first and self.saved is None:
                    fh.seek(0, os.SEEK_END)
                self.saved = None
                first = False
                self.stats.up = True
                yield from self._follow(fh, inode, stop)
            self.stats.up = False

    def _follow(self, fh: Any, inode: str, stop: threading.Event) -> Iterator[Line]:
        buf = b""
        offset = fh.tell()
        while not stop.is_set():
            chunk = fh.read(READ_CHUNK)
            if not chunk:
                try:
                    now = os.stat(self.path)
                    gone = f"{now.st_dev}:{now.st_ino}" != inode or now.st_size < offset
                except OSError:
                    gone = False
                if gone:
                    return
                stop.wait(self.poll_seconds)
                continue
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for raw in complete:
                offset += len(raw) + 1
                self.stats.records += 1
                message, _ = strip_prefix(raw[:MAX_LINE].decode("utf-8", errors="replace"))
                yield Line(message, {"kind": "file", "inode": inode, "offset": offset})
            if len(buf) > MAX_LINE:
                offset += len(buf)
                buf = b""
                self.stats.garbage += 1


class JournaldSource:
    """journald's kernel messages: `journalctl -k -f -o json`, resumed with `--after-cursor`."""

    def __init__(
        self,
        cursor: Cursor | None,
        replay_seconds: float,
        journalctl: str = "journalctl",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.saved = cursor if cursor and cursor.get("kind") == "journald" else None
        self.replay_seconds = replay_seconds
        self.journalctl = journalctl
        self.extra_args = extra_args
        self.stats = SourceStats()

    def _argv(self) -> list[str]:
        argv = [self.journalctl, "-k", "-f", "-o", "json", "--no-pager", *self.extra_args]
        if self.saved and self.saved.get("cursor"):
            argv.append(f"--after-cursor={self.saved['cursor']}")
        else:
            argv.append(f"--since=-{int(self.replay_seconds)}s" if self.replay_seconds else "--lines=0")
        return argv

    def lines(self, stop: threading.Event) -> Iterator[Line]:
        while not stop.is_set():
            try:
                proc = subprocess.Popen(
                    self._argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
                )
            except OSError as exc:
                self.stats.error(f"{self.journalctl}: {exc.strerror}")
                stop.wait(1.0)
                continue
            killer = threading.Thread(target=_end_on_stop, args=(proc, stop), daemon=True)
            killer.start()
            self.stats.up = True
            try:
                assert proc.stdout is not None
                for raw in proc.stdout:
                    line = self._entry(raw)
                    if line is not None:
                        self.saved = line.cursor
                        yield line
            finally:
                self.stats.up = False
                if proc.poll() is None:
                    proc.terminate()
                proc.wait(5)
                err = proc.stderr.read().decode(errors="replace")[-300:] if proc.stderr else ""
                if not stop.is_set():
                    self.stats.error(f"journalctl exited {proc.returncode}: {err.strip()}")
            stop.wait(1.0)

    def _entry(self, raw: bytes) -> Line | None:
        try:
            entry = json.loads(raw)
            cursor = str(entry["__CURSOR"])
        except (ValueError, KeyError, TypeError):
            self.stats.garbage += 1
            return None
        self.stats.records += 1
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # journald's JSON gives non-UTF-8 messages as byte arrays
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", errors="replace")
        if not isinstance(message, str):
            return Line("", {"kind": "journald", "cursor": cursor})
        stamp = entry.get("__REALTIME_TIMESTAMP")
        wall = int(stamp) / 1e6 if isinstance(stamp, str) and stamp.isdigit() else None
        return Line(message[:MAX_LINE], {"kind": "journald", "cursor": cursor}, wall)


def _end_on_stop(proc: subprocess.Popen[bytes], stop: threading.Event) -> None:
    while proc.poll() is None:
        if stop.wait(0.5):
            proc.terminate()
            return


def open_source(kind: str, path: Path | None, cursor: Cursor | None, **opts: Any) -> Source:
    if kind == "kmsg":
        return KmsgSource(
            path or Path("/dev/kmsg"),
            cursor,
            opts["boot_id_file"],
            opts["replay_seconds"],
            opts.get("poll_seconds", 0.02),
        )
    if kind == "file":
        if path is None:
            raise ValueError("source file: a --path is required")
        return FileSource(path, cursor, opts.get("poll_seconds", 0.02))
    if kind == "journald":
        return JournaldSource(cursor, opts["replay_seconds"], opts.get("journalctl", "journalctl"))
    raise ValueError(f"source: {kind!r} is not kmsg, journald or file")
