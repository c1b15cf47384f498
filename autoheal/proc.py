"""Is a PID still the process we think it is? One answer for the lab and the runner.

A PID recorded in a file or a journal row outlives its process, and Linux hands PIDs out again, so
"a process with this PID exists" is not enough before sending a signal. Every process carries its
kernel start time (clock ticks since boot, /proc/<pid>/stat field 22), fixed for its life: a PID
paired with that number names exactly one process, ever. Zombies count as gone (they have exited
and only wait to be reaped). Linux only: this reads /proc.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/<pid>/stat this project reads."""

    pid: int
    comm: str
    state: str
    ppid: int
    start_ticks: int


def stat(pid: int) -> Stat | None:
    """The process's stat line, or None when there is no such process (any more)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ')'
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    return Stat(pid, head.partition("(")[2], fields[0], int(fields[1]), int(fields[19]))


def start_ticks(pid: int) -> int | None:
    """The kernel start time of a live process; None when it is gone or a zombie."""
    st = stat(pid)
    return None if st is None or st.state == "Z" else st.start_ticks


def is_same(pid: int, ticks: int) -> bool:
    """True while `pid` is alive and is the process that had start time `ticks`."""
    return start_ticks(pid) == ticks


def age(pid: int) -> float | None:
    """Seconds since a live process started (None when gone). Measured on the boot clock, so a
    wall-clock step since boot does not shift it."""
    ticks = start_ticks(pid)
    if ticks is None:
        return None
    try:
        uptime = float((PROC / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - ticks / _HZ)


def started_within(
    pid: int, after: float | None = None, before: float | None = None, slack: float = 1.0
) -> bool:
    """True while `pid` is alive and started between the wall-clock times `after` and `before`
    (each optional, widened by `slack` for the tick and clock rounding).

    For a PID recorded next to a timestamp, without its start ticks: the runner that created a run
    started before the run did; the play of a run started after it. A later process that reuses
    the PID started too late to pass.
    """
    seconds = age(pid)
    if seconds is None:
        return False
    started = time.time() - seconds
    if after is not None and started < after - slack:
        return False
    return before is None or started <= before + slack


def cmdline(pid: int) -> list[str]:
    """The process's arguments ([] when gone, a zombie or a kernel thread)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def environ(pid: int) -> dict[str, str]:
    """The environment the process started with ({} when gone or not ours to read)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def ancestors(pid: int) -> list[int]:
    """`pid`'s parent, its parent, ... up to init (for "never signal the caller itself")."""
    out: list[int] = []
    st = stat(pid)
    while st is not None and st.ppid > 0 and st.ppid not in out:
        out.append(st.ppid)
        st = stat(st.ppid)
    return out


def pids() -> Iterator[int]:
    """Every PID now in /proc (processes, not threads)."""
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, children first. Read before anything is signalled: a child
    that started its own session (ansible-runner's plays, Slurm's job steps) is not in its
    parent's process group, and once its parent is gone it belongs to init."""
    children: dict[int, list[int]] = {}
    for p in pids():
        st = stat(p)
        if st is not None:
            children.setdefault(st.ppid, []).append(p)
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop(0)
        out.append(child)
        todo.extend(children.get(child, []))
    return out
