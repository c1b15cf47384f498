"""The lab's one process manager: start and stop its daemons by PID, and never anybody else's.

Each process gets a log file (logs/<name>.log) and a PID file (pids/<name>.json) holding its PID
*and* its kernel start time, so a stale PID file can never make us signal a recycled PID that now
belongs to someone else (autoheal.proc). Every process starts in its own session, so a stop
reaches its process group, and its descendants are collected before any signal because some of
them (ansible-runner's plays) start sessions of their own. Slurm, Prometheus, the simulator, the
pool controller, the runner and the Kubernetes control plane all start and stop through here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from autoheal import proc as kernel
from autoheal.errors import LabError

# Popen objects of the processes this interpreter started, by PID: polling one reaps it, so an
# exited child is never mistaken for a live one (a zombie keeps its PID), and its exit code can
# be reported.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
KILL_WAIT_S = 5.0  # SIGKILL is final; this only waits for the kernel to finish the process


@dataclass(frozen=True)
class Proc:
    """One process the lab started: what the PID file says."""

    name: str
    pid: int
    start_ticks: int
    log: Path


def pid_dir(run_dir: Path) -> Path:
    return run_dir / "pids"


def log_dir(run_dir: Path) -> Path:
    return run_dir / "logs"


def log_path(run_dir: Path, name: str) -> Path:
    return log_dir(run_dir) / f"{name}.log"


def _pid_file(run_dir: Path, name: str) -> Path:
    return pid_dir(run_dir) / f"{name}.json"


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
        # a restarted service appends: the marker says where this start begins
        out.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
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
    _CHILDREN[p.pid] = p
    # 0 when it has already exited: is_alive() is then False, as it should be
    ticks = kernel.start_ticks(p.pid) or 0
    return _record(run_dir, Proc(name, p.pid, ticks, log), argv)


def adopt(name: str, pid: int, run_dir: Path, log: Path, argv: Sequence[str]) -> Proc:
    """Give a PID file to a daemon the lab started through a launcher that detaches it (pg_ctl
    starts postgres in a session of its own and returns), so `stop`, `running` and `down` reach
    it like any other. Fails if `pid` does not run."""
    ticks = kernel.start_ticks(pid)
    if not ticks:
        raise LabError(f"{name}: process {pid} is not running")
    pid_dir(run_dir).mkdir(parents=True, exist_ok=True)
    return _record(run_dir, Proc(name, pid, ticks, log), argv)


def _record(run_dir: Path, proc: Proc, argv: Sequence[str]) -> Proc:
    rec = {"pid": proc.pid, "start_ticks": proc.start_ticks, "argv": list(argv), "log": str(proc.log)}
    _pid_file(run_dir, proc.name).write_text(json.dumps(rec))
    return proc


def read_proc(run_dir: Path, name: str) -> Proc | None:
    try:
        rec = json.loads(_pid_file(run_dir, name).read_text())
        return Proc(name, int(rec["pid"]), int(rec["start_ticks"]), Path(rec["log"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_alive(proc: Proc) -> bool:
    """True while the process of this PID file runs (not a recycled PID, not a zombie)."""
    child = _CHILDREN.get(proc.pid)
    if child is not None:
        child.poll()  # reaps it if it has exited
    return kernel.is_same(proc.pid, proc.start_ticks)


def exit_code(proc: Proc) -> int | None:
    """The exit code of a process this interpreter started and that has exited, else None."""
    child = _CHILDREN.get(proc.pid)
    return child.poll() if child is not None else None


def names(run_dir: Path) -> list[str]:
    """Every process that has a PID file in this lab, alive or not."""
    d = pid_dir(run_dir)
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def running(run_dir: Path) -> dict[str, Proc]:
    """Every process of this lab whose PID file still names a live process we started."""
    out: dict[str, Proc] = {}
    for name in names(run_dir):
        proc = read_proc(run_dir, name)
        if proc and is_alive(proc):
            out[proc.name] = proc
    return out


def stop(run_dir: Path, name: str, timeout: float = 10.0) -> bool:
    """SIGTERM the process group, then SIGKILL after `timeout`. True if something was stopped."""
    return bool(stop_many(run_dir, [name], timeout))


def stop_many(run_dir: Path, stop_names: Sequence[str], timeout: float = 10.0) -> list[str]:
    """Stop several processes at once: signal all, then wait, so teardown of 100 slurmd is fast.
    Returns the names that were running; their PID files are removed."""
    procs = [p for n in stop_names if (p := read_proc(run_dir, n))]
    live = [p for p in procs if is_alive(p)]
    # children that outlive their leader (same process group, or a session of their own) go too
    trees = [(pid, t) for p in live for pid in kernel.descendants(p.pid) if (t := kernel.start_ticks(pid))]
    for p in live:
        _signal_group(p.pid, signal.SIGTERM)
    _wait_gone(live, timeout)
    for p in live:
        if is_alive(p):
            _signal_group(p.pid, signal.SIGKILL)
    end(trees, signal.SIGKILL)
    _wait_gone(live, KILL_WAIT_S)
    for p in procs:
        _pid_file(run_dir, p.name).unlink(missing_ok=True)
        _CHILDREN.pop(p.pid, None)
    return [p.name for p in live]


def _wait_gone(procs: Sequence[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(is_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.02)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def end(targets: Iterable[tuple[int, int]], sig: int) -> int:
    """Send `sig` to each (pid, start ticks) that is still that process; returns how many got it."""
    sent = 0
    for pid, ticks in targets:
        if kernel.is_same(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                sent += 1
    return sent


def terminate(targets: Sequence[tuple[int, int]], grace: float = 3.0) -> tuple[int, int]:
    """End processes that are not ours by PID file (a job's leftovers): SIGTERM each (pid, start
    ticks) that is still that process, SIGKILL what outlives `grace` (slurmstepd ignores SIGTERM).
    Returns (how many were running, how many needed SIGKILL)."""
    live = [t for t in targets if kernel.is_same(*t)]
    end(live, signal.SIGTERM)
    wait_ended(live, grace)
    stubborn = [t for t in live if kernel.is_same(*t)]
    end(stubborn, signal.SIGKILL)
    wait_ended(stubborn, KILL_WAIT_S)
    return len(live), len(stubborn)


def wait_ended(targets: Sequence[tuple[int, int]], timeout: float) -> None:
    """Wait until none of the (pid, start ticks) runs any more, or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while any(kernel.is_same(*t) for t in targets) and time.monotonic() < deadline:
        time.sleep(0.05)


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def log_tail(path: Path, lines: int = 5, sep: str = " | ") -> str:
    """The last `lines` lines of a log (read from its last 16 KiB: logs grow large)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return sep.join(data.strip().splitlines()[-lines:])


def start_service(
    name: str,
    argv: Sequence[str],
    run_dir: Path,
    *,
    ready: Callable[[], bool],
    timeout: float,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Proc:
    """Start a daemon and wait until `ready()`. A taken port fails before anything starts (its
    health check could otherwise be answered by another lab's server); a daemon that exits while
    starting fails at once, naming its log."""
    if port is not None and not port_free(port):
        raise LabError(f"{name}: port {port} is in use; choose another --port-base")
    proc = spawn(name, argv, run_dir, env=env, cwd=cwd)
    wait_until(ready, timeout, name, proc)
    return proc


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check: `url` answers 200."""
    return lambda: httpx.get(url, timeout=1.0).status_code == 200


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
            raise LabError(f"{proc.name}: exited during start; see {proc.log}: {log_tail(proc.log)}")
        if time.monotonic() > deadline:
            where = f"; see {proc.log}: {log_tail(proc.log)}" if proc else ""
            raise LabError(f"{what}: not ready after {timeout:.0f}s{where}")
        time.sleep(interval)
