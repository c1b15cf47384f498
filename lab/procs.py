"""Start and stop the lab's daemons by PID, and never anybody else's.

Each process gets a log file and a PID file holding its PID *and* its kernel start time, so a stale
PID file can never make us signal a recycled PID that now belongs to someone else. Every process is
started in its own session so a stop reaches its children too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from autoheal.errors import LabError


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    start_ticks: int
    log: Path


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: fields start after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def pid_dir(run_dir: Path) -> Path:
    return run_dir / "pids"


def log_dir(run_dir: Path) -> Path:
    return run_dir / "logs"


def log_path(run_dir: Path, name: str) -> Path:
    return log_dir(run_dir) / f"{name}.log"


def spawn(
    name: str,
    argv: Sequence[str],
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start `argv` in the background with its output in logs/<name>.log and a PID file."""
    pid_dir(run_dir).mkdir(parents=True, exist_ok=True)
    log_dir(run_dir).mkdir(parents=True, exist_ok=True)
    log = log_path(run_dir, name)
    full_env = dict(os.environ)
    full_env.update(env or {})
    with log.open("ab") as out:
        try:
            p = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise LabError(f"{name}: cannot start {argv[0]!r}: {exc.strerror}") from exc
    ticks = _start_ticks(p.pid) or 0
    rec = {"pid": p.pid, "start_ticks": ticks, "argv": list(argv), "log": str(log)}
    (pid_dir(run_dir) / f"{name}.json").write_text(json.dumps(rec))
    return Proc(name, p.pid, ticks, log)


def read_proc(run_dir: Path, name: str) -> Proc | None:
    path = pid_dir(run_dir) / f"{name}.json"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return Proc(name, int(rec["pid"]), int(rec["start_ticks"]), Path(rec["log"]))


def is_alive(proc: Proc) -> bool:
    ticks = _start_ticks(proc.pid)
    return ticks is not None and ticks == proc.start_ticks


def running(run_dir: Path) -> dict[str, Proc]:
    """Every process of this lab whose PID file still names a live process we started."""
    out: dict[str, Proc] = {}
    d = pid_dir(run_dir)
    if not d.is_dir():
        return out
    for f in sorted(d.glob("*.json")):
        proc = read_proc(run_dir, f.stem)
        if proc and is_alive(proc):
            out[proc.name] = proc
    return out


def stop(run_dir: Path, name: str, timeout: float = 10.0) -> bool:
    """SIGTERM the process group, then SIGKILL after `timeout`. True if something was stopped."""
    proc = read_proc(run_dir, name)
    pidfile = pid_dir(run_dir) / f"{name}.json"
    if proc is None:
        return False
    stopped = False
    tree = descendants(proc.pid) if is_alive(proc) else []
    if is_alive(proc):
        stopped = True
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while is_alive(proc) and time.monotonic() < deadline:
            _reap(proc.pid)
            time.sleep(0.05)
        if is_alive(proc):
            _signal_group(proc.pid, signal.SIGKILL)
            while is_alive(proc):
                _reap(proc.pid)
                time.sleep(0.02)
    # children that outlived their leader (same process group, or a session of their own) go too
    _signal_group(proc.pid, signal.SIGKILL)
    _kill_tree(tree, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return stopped


def stop_many(run_dir: Path, names: Sequence[str], timeout: float = 10.0) -> list[str]:
    """Stop several processes at once: signal all, then wait, so teardown of 100 slurmd is fast."""
    procs = [p for n in names if (p := read_proc(run_dir, n))]
    live = [p for p in procs if is_alive(p)]
    trees = [t for p in live for t in descendants(p.pid)]
    for p in live:
        _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(is_alive(p) for p in live) and time.monotonic() < deadline:
        for p in live:
            _reap(p.pid)
        time.sleep(0.05)
    for p in procs:
        if is_alive(p):
            _signal_group(p.pid, signal.SIGKILL)
        _signal_group(p.pid, signal.SIGKILL)
        (pid_dir(run_dir) / f"{p.name}.json").unlink(missing_ok=True)
    _kill_tree(trees, signal.SIGKILL)
    return [p.name for p in live]


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, found through /proc before anything is signalled: children
    that started their own session (ansible-runner's plays do) are not in the process group."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, []))
    return out


def _kill_tree(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    proc: Proc | None = None,
    interval: float = 0.1,
) -> None:
    """Poll `check` until it is true; fail early and clearly if `proc` died meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: S110 - a check that raises is simply not ready yet
            pass
        if proc is not None and not is_alive(proc):
            _reap(proc.pid)
            raise LabError(f"{proc.name}: exited during start; see {proc.log}: {log_tail(proc.log)}")
        if time.monotonic() > deadline:
            where = f"; see {proc.log}: {log_tail(proc.log)}" if proc else ""
            raise LabError(f"{what}: not ready after {timeout:.0f}s{where}")
        time.sleep(interval)
