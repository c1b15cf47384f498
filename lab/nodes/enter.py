"""Start a program inside a real node: its cgroup, then its mount and network namespaces.

    python -m lab.nodes.enter --cgroup autoheal.<id>/<node>/system --ns-pid PID -- PROGRAM ARGS...

Joins the cgroup first (so the program and everything it ever forks is found and ended by
teardown), then the namespaces held by PID (the node's holder process), then execs PROGRAM. Python
3.11 has no os.setns, hence the libc call.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

from lab.nodes import cgroups

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000


def setns(pid: int, kind: str, flag: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
    try:
        if libc.setns(fd, flag) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({kind} of pid {pid}): {os.strerror(err)}")
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cgroup", required=True, help="cgroup path below each v1 hierarchy")
    ap.add_argument("--ns-pid", type=int, default=0, help="join this process's mount + net namespaces")
    ap.add_argument("--cwd", default="/")
    ap.add_argument("program", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    prog = a.program[1:] if a.program[:1] == ["--"] else a.program
    if not prog:
        ap.error("no program given")
    cgroups.join(a.cgroup)
    if a.ns_pid:
        setns(a.ns_pid, "mnt", CLONE_NEWNS)
        setns(a.ns_pid, "net", CLONE_NEWNET)
    os.chdir(a.cwd)  # the old cwd belongs to the mount namespace just left
    sys.stdout.flush()
    os.execvp(prog[0], prog)  # noqa: S606 - replacing this process is the point


if __name__ == "__main__":
    main()
