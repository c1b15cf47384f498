"""Kernel log records: /dev/kmsg's record format, and the text forms dmesg and syslog print.

The XID watcher reads the kernel log from three places (docs/architecture.md, "The flow of one
fault"): /dev/kmsg, journald, or a plain file. Each gives the same kernel message with a
different wrapper; this module strips the wrapper and keeps what restart safety needs.

/dev/kmsg (Documentation/ABI/testing/dev-kmsg): one record per read(2),
``"<prio>,<seq>,<usec>,<flags>[,...];<message>\\n"`` followed by optional dictionary lines that
start with a space (`` SUBSYSTEM=pci``). The priority holds facility * 8 + level, `seq` grows by
one per record within a boot (a gap means the ring buffer overwrote records we did not read),
`usec` is microseconds since boot, and non-printable bytes and backslashes in the message are
escaped as ``\\xNN``.

Kernel text is untrusted input: a GPU that floods, a truncated write, a process writing into
/dev/kmsg. Parsing never raises on bad input; it returns None, and every field is bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_MESSAGE = 4096  # the kernel's own record limit is ~1 KiB of text; anything longer is not a record

_RECORD = re.compile(r"^(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;,]{0,8})(?:,[^;]*)?;(.*)$", re.DOTALL)
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
# `[ 1843.308145] msg` as dmesg prints it (also inside a syslog line after "kernel: ")
_DMESG = re.compile(r"^\[\s*(\d{1,10})\.(\d{1,6})\]\s?(.*)$", re.DOTALL)
# `Nov 30 12:00:01 host kernel: msg` (RFC 3164 syslog) or `2026-11-30T12:00:01.123+00:00 host kernel: msg`
_SYSLOG = re.compile(
    r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?)"
    r" \S{1,255} kernel: (.*)$",
    re.DOTALL,
)


@dataclass(frozen=True)
class KmsgRecord:
    """One kernel log record, as /dev/kmsg gives it."""

    seq: int
    usec: int  # microseconds since boot (CLOCK_MONOTONIC at the time of the printk)
    level: int  # 0 (emerg) .. 7 (debug)
    facility: int  # 0: kernel; a userspace write to /dev/kmsg gets 1 (user) unless it says otherwise
    message: str
    continuation: bool = False  # flags 'c': an old-style continuation fragment


def unescape(text: str) -> str:
    """Undo /dev/kmsg's ``\\xNN`` escaping of non-printable bytes and backslashes (the kernel escapes
    byte by byte, so a UTF-8 character arrives as several escapes: decode the bytes together)."""
    if "\\x" not in text:
        return text
    raw = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text).encode("latin-1", errors="replace")
    return raw.decode("utf-8", errors="replace")


def parse_record(raw: str | bytes) -> KmsgRecord | None:
    """Parse one /dev/kmsg record (its dictionary lines are dropped), or None if it is not one."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    head, _, _dictionary = raw.partition("\n ")
    m = _RECORD.match(head.rstrip("\n"))
    if m is None:
        return None
    prio, seq, usec, flags, message = m.groups()
    if len(message) > MAX_MESSAGE:
        return None
    p = int(prio)
    return KmsgRecord(
        seq=int(seq),
        usec=int(usec),
        level=p & 7,
        facility=p >> 3,
        message=unescape(message),
        continuation="c" in flags,
    )


def format_record(seq: int, usec: int, message: str, level: int = 3, facility: int = 0) -> str:
    """A record as /dev/kmsg would give it (the lab's simulated nodes write these; tests too)."""
    # the kernel escapes every byte below 0x20 or above 0x7e, and the backslash
    escaped = "".join(
        chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in message.encode("utf-8")
    )
    return f"{facility * 8 + level},{seq},{usec},-;{escaped}\n"


def strip_prefix(line: str) -> tuple[str, int | None]:
    """The kernel message inside a dmesg or syslog text line, and its seconds-since-boot stamp in
    microseconds if the line carried one. A line with no known prefix is returned as it is."""
    line = line.rstrip("\r\n")
    m = _SYSLOG.match(line)
    if m is not None:
        line = m.group(1)
    d = _DMESG.match(line)
    if d is None:
        return line, None
    return d.group(3), int(d.group(1)) * 1_000_000 + int(d.group(2).ljust(6, "0"))
