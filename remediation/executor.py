"""Running a playbook for a batch of nodes through ansible-runner, safely.

- Inputs are typed and validated here, whatever the caller: node names through autoheal.names,
  incident ids, XID and GPU as small integers, tier from a fixed set. No alert text is ever passed.
- One run takes a batch of nodes (`autoheal_nodes`), so a storm costs a few ansible processes,
  not one per node.
- A per-node lock (an flock'ed file, so it also holds against `autoheal run` in another process and
  is released by the kernel if the runner dies) keeps two runs off the same node.
- The play reports its phases as JSON lines in `autoheal_journal_events`; the executor tails that
  file while the play runs and hands valid lines to the caller; ansible-runner's own events become
  step rows (task, host, status, start, end).
- Step timeouts: a task running longer than `step_timeout` cancels the run; the whole run has a
  timeout too; a cancel callback from the caller (an on-call `cancel`) stops it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ansible_runner

from autoheal import __version__, proc
from autoheal.errors import ValidationError
from autoheal.names import validate_node_name
from remediation.errors import ExecutionError, NodeBusyError
from remediation.states import RunStatus

INCIDENT_ID_RE = re.compile(r"^(?:inc|man)-[0-9a-f]{12}$")
PHASE_RE = re.compile(r"^[a-z][a-z0-9_]{0,40}$")
PLAYBOOK_RE = re.compile(r"^[a-z0-9_][a-z0-9_-]{0,63}\.ya?ml$")
EVENT_STATUSES = frozenset({"start", "ok", "failed"})
# the ladder's rungs (drain: the degraded play's gentle rung, playbooks/gpu_degraded.yml)
PLAY_TIERS = frozenset({"restart_app", "drain", "reset", "reboot", "replace", "quarantine"})
STOP_AFTER = frozenset({"", "fenced"})
SIGNAL_LEDGER = "signalled.json"  # beside the run's journal events (the fence module's signal_ledger)
_STEP_END = {
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_skipped": "skipped",
    "runner_on_unreachable": "unreachable",
    "runner_item_on_failed": None,
}


@dataclass(frozen=True)
class PlayVars:
    """The playbook contract; `extravars()` validates and renders it."""

    nodes: tuple[str, ...]
    incident_ids: tuple[str, ...]
    xid: int
    gpu: int | None
    tier: str
    opt_out: bool
    dry_run: bool
    grace_seconds: int
    journal_events: Path
    done_phases: Mapping[str, Sequence[str]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    stop_after: str = ""  # "fenced": a fence-only run (the worker's fence lane)
    fault_time: float = 0.0  # when the batch's first incident opened: restart_app's job filter
    kernel_lines: Path | None = None  # the watcher's kernel lines of the batch (remediation/kernel_lines.py)

    def extravars(self) -> dict[str, Any]:
        if not self.nodes or len(self.nodes) != len(self.incident_ids):
            raise ExecutionError("a run needs nodes and one incident id per node")
        try:
            nodes = [validate_node_name(n, "autoheal_nodes") for n in self.nodes]
        except ValidationError as exc:
            raise ExecutionError(str(exc)) from exc
        if len(set(nodes)) != len(nodes):
            raise ExecutionError("a node appears twice in one run")
        for iid in self.incident_ids:
            if not INCIDENT_ID_RE.fullmatch(iid):
                raise ExecutionError(f"bad incident id {iid[:40]!r}")
        if not (0 <= self.xid < 1000) or (self.gpu is not None and not 0 <= self.gpu < 64):
            raise ExecutionError("xid must be 0..999 and gpu 0..63 or null")
        if self.tier not in PLAY_TIERS:
            raise ExecutionError(f"tier must be one of {sorted(PLAY_TIERS)}")
        if self.stop_after not in STOP_AFTER:
            raise ExecutionError(f"stop_after must be one of {sorted(STOP_AFTER)}")
        done: dict[str, list[str]] = {}
        for node, phases in self.done_phases.items():
            if node in nodes:
                done[node] = [p for p in phases if PHASE_RE.fullmatch(p)]
        out: dict[str, Any] = dict(self.extra)
        out.update(
            {
                "autoheal_nodes": nodes,
                "autoheal_incident_ids": list(self.incident_ids),
                "autoheal_xid": int(self.xid),
                "autoheal_gpu": None if self.gpu is None else int(self.gpu),
                "autoheal_tier": self.tier,
                "autoheal_opt_out": bool(self.opt_out),
                "autoheal_dry_run": bool(self.dry_run),
                "autoheal_grace_seconds": int(self.extra.get("autoheal_grace_seconds", self.grace_seconds)),
                "autoheal_journal_events": str(self.journal_events),
                # one per run, shared by the warm fence and the play's fence step: jobs signalled once
                "autoheal_signal_ledger": str(self.journal_events.with_name(SIGNAL_LEDGER)),
                "autoheal_done_phases": done,
                "autoheal_stop_after": self.stop_after,
                "autoheal_fault_time": float(self.fault_time),
                # the release that acts: the audit role labels the Kubernetes Events with it
                "autoheal_version": __version__,
            }
        )
        if self.kernel_lines is not None:  # a file, never the lines themselves: alert text is no extra var
            out["autoheal_kernel_lines"] = str(self.kernel_lines)
        return out


@dataclass(frozen=True)
class PhaseEvent:
    """One validated line of the play's journal-events file."""

    incident: str
    node: str
    phase: str
    status: str
    ts: float
    detail: str = ""


def parse_event_line(line: str, allowed: Mapping[str, str]) -> PhaseEvent | None:
    """Validate one JSON line against the run's incidents (`allowed`: incident id -> node)."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    inc, node, phase = data.get("incident"), data.get("node"), data.get("phase")
    status, ts = data.get("status"), data.get("ts")
    if not isinstance(inc, str) or allowed.get(inc) != node:
        return None
    if not isinstance(phase, str) or not PHASE_RE.fullmatch(phase) or status not in EVENT_STATUSES:
        return None
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        ts = time.time()
    detail = data.get("detail")
    return PhaseEvent(
        inc, str(node), phase, str(status), float(ts), detail[:500] if isinstance(detail, str) else ""
    )


def read_events(path: Path, offset: int, allowed: Mapping[str, str]) -> tuple[list[PhaseEvent], int]:
    """New complete lines of the events file from `offset`; returns them and the next offset."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    events = []
    for raw in data[: end + 1].splitlines():
        ev = parse_event_line(raw.decode("utf-8", "replace"), allowed)
        if ev is not None:
            events.append(ev)
    return events, offset + end + 1


class NodeLocks:
    """Per-node exclusive locks on files under `lock_dir` (held across processes)."""

    def __init__(self, lock_dir: Path) -> None:
        self.dir = lock_dir
        self.dir.mkdir(parents=True, exist_ok=True)

    def busy(self, node: str) -> bool:
        """True when another holder has `node` locked now (a probe; the lock is not kept)."""
        validate_node_name(node)
        with (self.dir / f"{node}.lock").open("a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False

    @contextmanager
    def hold(self, nodes: Sequence[str]) -> Iterator[None]:
        handles: list[IO[str]] = []
        try:
            for node in sorted(set(nodes)):
                validate_node_name(node)
                fh = (self.dir / f"{node}.lock").open("a")
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    fh.close()
                    raise NodeBusyError(f"node {node} is locked by another run") from None
                handles.append(fh)
            yield
        finally:
            for held in handles:
                fcntl.flock(held, fcntl.LOCK_UN)
                held.close()


@dataclass
class RunOutcome:
    status: RunStatus
    rc: int | None
    detail: str = ""


StepSink = Callable[[str, str, str, bool, float | None, float], None]


class Executor:
    """Runs playbooks from `playbook_dir` with ansible-runner; one call = one run."""

    def __init__(
        self,
        playbook_dir: Path,
        state_dir: Path,
        *,
        step_timeout: float,
        run_timeout: int,
        python: Path | None = None,
    ) -> None:
        self.playbook_dir = playbook_dir
        self.state_dir = state_dir
        self.step_timeout = step_timeout
        self.run_timeout = run_timeout
        self.python = python or Path(sys.executable)
        self.locks = NodeLocks(state_dir / "locks")

    def playbook_path(self, name: str) -> Path:
        base = name.removeprefix("playbooks/")
        if not PLAYBOOK_RE.fullmatch(base):
            raise ExecutionError(f"playbook name {name[:80]!r} is not <name>.yml")
        path = self.playbook_dir / base
        if not path.is_file():
            raise ExecutionError(f"playbook {path} does not exist")
        return path

    def run_dir(self, run_id: int) -> Path:
        return self.state_dir / "runs" / str(run_id)

    def events_path(self, run_id: int) -> Path:
        return self.run_dir(run_id) / "journal-events.jsonl"

    def run(
        self,
        run_id: int,
        playbook: str,
        play_vars: PlayVars,
        *,
        on_pid: Callable[[int], None],
        on_step: StepSink,
        on_tick: Callable[[], bool],
    ) -> RunOutcome:
        """Run to completion. `on_tick` is polled ~5x/s: ingest events, return True to cancel."""
        path = self.playbook_path(playbook)
        extravars = play_vars.extravars()
        private = self.run_dir(run_id)
        private.mkdir(parents=True, exist_ok=True)
        watch = _PlayWatch(self.step_timeout, on_pid, on_step, on_tick)
        try:
            runner = ansible_runner.run(
                private_data_dir=str(private),
                playbook=str(path),
                inventory=(f"localhost ansible_connection=local ansible_python_interpreter={self.python}"),
                extravars=extravars,
                cmdline="--check" if play_vars.dry_run else None,
                envvars=self._ansible_env(),
                settings={"pexpect_timeout": 0.2, "suppress_ansible_output": True},
                event_handler=watch.handle,
                cancel_callback=watch.cancel,
                timeout=self.run_timeout,
                quiet=True,
                ident="play",
                rotate_artifacts=1,
            )
        except Exception as exc:  # ansible-runner raises on bad config, missing binaries
            return RunOutcome(RunStatus.ERROR, None, f"ansible-runner failed to start: {exc}")
        on_tick()
        status = RunStatus.from_runner(str(runner.status))
        detail = watch.reason if status in (RunStatus.CANCELLED, RunStatus.TIMEOUT) else ""
        if status is RunStatus.CANCELLED and watch.step_timed_out:
            status = RunStatus.TIMEOUT
        if status is RunStatus.TIMEOUT and not detail:
            detail = f"run exceeded {self.run_timeout}s"
        return RunOutcome(status, runner.rc, detail)

    def _ansible_env(self) -> dict[str, str]:
        repo = self.playbook_dir.parent  # the data root: roles/ and collections/ beside playbooks/
        return {
            "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_NOCOLOR": "True",
            "ANSIBLE_ROLES_PATH": str(repo / "roles"),
            "ANSIBLE_COLLECTIONS_PATH": str(repo / "collections"),
            # ansible-playbook from the same environment as the runner, found first
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        }


class _PlayWatch:
    """ansible-runner's callbacks for one run: its events become step rows, and its cancel poll
    enforces the step timeout and the caller's cancel."""

    def __init__(
        self,
        step_timeout: float,
        on_pid: Callable[[int], None],
        on_step: StepSink,
        on_tick: Callable[[], bool],
    ) -> None:
        self.step_timeout = step_timeout
        self.on_pid = on_pid
        self.on_step = on_step
        self.on_tick = on_tick
        self.started: dict[str, float] = {}  # task uuid -> start, for tasks still running
        self.reason = ""  # why the run was cancelled
        self.step_timed_out = False

    def handle(self, event: dict[str, Any]) -> bool:
        kind = str(event.get("event", ""))
        data = event.get("event_data") or {}
        now = time.time()
        if kind == "playbook_on_start" and isinstance(event.get("pid"), int):
            self.on_pid(int(event["pid"]))
        elif kind == "runner_on_start":
            self.started[str(data.get("task_uuid", ""))] = now
        elif _STEP_END.get(kind):
            t0 = self.started.pop(str(data.get("task_uuid", "")), None)
            changed = bool((data.get("res") or {}).get("changed"))
            self.on_step(
                str(data.get("task", "")), str(data.get("host", "")), str(_STEP_END[kind]), changed, t0, now
            )
        return True  # keep ansible-runner's own record of the event too

    def cancel(self) -> bool:
        now = time.time()
        if any(now - t0 > self.step_timeout for t0 in self.started.values()):
            self.reason = f"a step ran longer than {self.step_timeout:.0f}s"
            self.step_timed_out = True
            return True
        if self.on_tick():
            self.reason = "cancelled"
            return True
        return False


def _is_play(argv: Sequence[str]) -> bool:
    return any("ansible-playbook" in a for a in argv)


def pid_is_play(pid: int, since: float | None = None) -> bool:
    """True when `pid` is alive and is an ansible-playbook process, started no earlier than
    `since` (the start of the run that recorded it: a later process reusing the PID is not it)."""
    return _is_play(proc.cmdline(pid)) and (since is None or proc.started_within(pid, after=since))


def find_plays(private_dir: str) -> list[int]:
    """PIDs of ansible-playbook processes started for `private_dir` (a dead runner's orphans)."""
    if not private_dir:
        return []
    found = []
    for pid in proc.pids():
        argv = proc.cmdline(pid)
        if _is_play(argv) and any(private_dir in a for a in argv):
            found.append(pid)
    return found


def stop_play(pid: int, wait: float = 10.0, since: float | None = None) -> None:
    """Stop a leftover play's process group (SIGTERM, then SIGKILL); `since` as in pid_is_play."""
    if not pid_is_play(pid, since):
        return
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    own = pgid == os.getpgid(0)

    def kill(sig: int) -> None:
        with suppress(ProcessLookupError):
            os.kill(pid, sig) if own else os.killpg(pgid, sig)

    kill(signal.SIGTERM)
    deadline = time.time() + wait
    while time.time() < deadline and pid_is_play(pid, since):
        time.sleep(0.1)
    if pid_is_play(pid, since):
        kill(signal.SIGKILL)
