"""The queue consumer: policy decisions, batching, runs, and resuming after a crash.

The queue is the journal's incidents table. Each tick: apply on-call cancels; unless paused, decide
pending incidents (policy), then group admitted incidents that share a playbook and inputs into
batches and start them (bounded by `max_concurrent_runs`, each under its nodes' locks). A finished
run closes its incidents (completed, quarantined, failed) from the play's own phase reports.

Fence first: a run is a whole runbook (30 s and more in a storm, most of it waiting for jobs to
checkpoint). When more admitted incidents are unfenced than one batch (a storm; its late arrivals
too, while its fence-only runs are in flight), or every run slot is busy, they would wait unfenced
behind those runs while jobs keep landing on nodes with dead GPUs; and full runs started side by
side fence slowly, competing for CPU with each other's later steps. So the worker fences them all
first, in short fence-only runs (the same play with `autoheal_stop_after=fenced`; at most
`max_concurrent_fences` at once, up to `max_fence_batch` nodes each). The incidents stay admitted
and get their full runs as slots free up (their fence steps then find nothing to change). An
incident that fits a free slot goes straight to its full run, which fences first anyway. Figures
with 500 of 2,000 nodes failing: bench/storm.py.

On start, `recover()` finds runs a dead runner left "running": it stops the orphaned
ansible-playbook, ingests the phases the play reported before the crash, marks the run interrupted
and puts its incidents back as admitted. The rerun gets `autoheal_done_phases`; the runbook's steps
are idempotent, so a finished destructive step finds nothing to do and is not repeated.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from enum import StrEnum
from pathlib import Path
from typing import IO, NamedTuple

from autoheal import proc
from remediation.backoff import Backoff
from remediation.config import RunnerConfig
from remediation.crashpoints import crash_point
from remediation.errors import ExecutionError, NodeBusyError, NotLeader, RemediationError
from remediation.executor import (
    Executor,
    PhaseEvent,
    PlayVars,
    RunOutcome,
    find_plays,
    read_events,
    stop_play,
)
from remediation.fencing import JournalFence
from remediation.journal import IncidentRecord, Journal, RunRecord, TimelineEntry
from remediation.leader import Term
from remediation.metrics import Metrics
from remediation.notify import Notifier, SpareShortage, no_spare_pool
from remediation.policy import BREAKER_KEY, PAUSE_KEY, Decision, Policy
from remediation.states import IN_REMEDIATION, IncidentState, RunStatus
from remediation.warmfence import PLAYBOOK as WARM_PLAYBOOK
from remediation.warmfence import WarmFence

log = logging.getLogger(__name__)
MIN_TICK_SECONDS = 0.05
PRUNE_EVERY_SECONDS = 3600.0
# A pool out of hot spares is capacity, not a failed remediation (docs/runbook.md): the incident
# completes with this reason and the pool's one `pool.spares_exhausted` notification covers it.
NO_SPARE_REASON = "no spare: jobs wait for capacity"
MAX_ERROR_BACKOFF_SECONDS = 30.0  # a failing tick is retried at most this far apart


class RunKind(StrEnum):
    """What a run is for. The value is the run's `source` in the journal."""

    FULL = "worker"  # the whole runbook; the run closes its incidents
    FENCE = "fence"  # fence first: the runbook up to `fenced`; its incidents stay admitted

    @property
    def stop_after(self) -> str:
        """The play's `autoheal_stop_after`: the phase after which it ends ("" = the end)."""
        return "fenced" if self is RunKind.FENCE else ""


class BatchKey(NamedTuple):
    """Incidents run as one batch when they share the playbook and every play input but the
    node (and incident id), so one ansible process serves them all."""

    playbook: str
    tier: str
    opt_out: bool
    dry_run: bool
    xid: int
    extra_vars: str  # the incident's extra vars, sorted and rendered: hashable

    @classmethod
    def of(cls, inc: IncidentRecord) -> BatchKey:
        return cls(
            inc.playbook, inc.tier, inc.opt_out, inc.dry_run, inc.xid, repr(sorted(inc.extra_vars.items()))
        )


class Worker:
    def __init__(
        self,
        config: RunnerConfig,
        journal: Journal,
        policy: Policy,
        executor: Executor,
        metrics: Metrics,
        notifier: Notifier,
        warm_fence: WarmFence | None = None,
        fence: JournalFence | None = None,
    ) -> None:
        self.config = config
        # With leader election (remediation/leader.py) the worker acts only while this replica
        # leads; `journal` is then a handle guarded by `fence` (remediation/fencing.py).
        self.fence = fence
        self._leading = fence is None
        self._new_term: Term | None = None
        self.warm_fence = warm_fence
        self.journal = journal
        self.policy = policy
        self.executor = executor
        self.metrics = metrics
        self.notifier = notifier
        self.shortage = SpareShortage(notifier.send)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(config.max_concurrent_runs, "autoheal-run")
        self._fence_pool = ThreadPoolExecutor(max(1, config.max_concurrent_fences), "autoheal-fence")
        # one thread per warm fence process (remediation/warmfence.py: one per fence slot)
        self._warm_pool = ThreadPoolExecutor(max(1, config.max_concurrent_fences), "autoheal-warm-fence")
        self._inflight: dict[int, Future[None]] = {}
        self._fencing: dict[int, Future[None]] = {}
        self._fence_tried: set[str] = set()  # incident ids a fence-only run has handled
        self._held_fenced: set[str] = set()  # held incidents fenced past the budget (_fence_held)
        self._inflight_nodes: set[str] = set()
        self._lock = threading.Lock()  # guards the in-flight maps and sets above
        self._runner_lock: IO[str] | None = None  # flock: one runner per state dir (start())
        self._uncordon_checked = 0.0
        self._pruned = 0.0  # the first tick prunes
        self._errors = Backoff(base=config.poll_seconds, cap=MAX_ERROR_BACKOFF_SECONDS)

    # lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        """Take the runner lock (one runner per state dir), resume leftovers, start the loop."""
        self._take_runner_lock()
        if self.warm_fence is not None:
            self.warm_fence.start()  # it imports Ansible meanwhile; the first fence waits for it
        if self.fence is None:
            self.recover()  # else when this replica starts leading (_ensure_leading)
        self._thread = threading.Thread(target=self._loop, name="autoheal-worker", daemon=True)
        self._thread.start()

    def _take_runner_lock(self) -> None:
        path = self.config.state_dir / "runner.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = path.open("a")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise RemediationError(
                f"another runner is working from {self.config.state_dir} (lock {path})"
            ) from None
        self._runner_lock = fh

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._fence_pool.shutdown(wait=True, cancel_futures=True)
        self._warm_pool.shutdown(wait=True, cancel_futures=True)
        if self.warm_fence is not None:
            self.warm_fence.close()
        if self._runner_lock is not None:
            self._runner_lock.close()
            self._runner_lock = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wake(self) -> None:
        self._wake.set()

    # leadership (called from the elector's thread) -------------------------------------------
    def lead(self, term: Term) -> None:
        """This replica won the Lease: claim the journal and resume from it (in the worker's loop)."""
        self._new_term = term
        self._wake.set()

    def depose(self) -> None:
        """This replica lost the Lease: write nothing more, and cancel the plays under way (their
        runs are resumed by the new leader, whose recover() finds them still running)."""
        self._new_term = None
        self._leading = False
        if self.fence is not None:
            self.fence.release()
        self._wake.set()

    @property
    def leading(self) -> bool:
        return self._leading

    def _ensure_leading(self) -> bool:
        """True when the worker may act. A new term is taken up once the runs of a former term of
        this replica have wound down (they were cancelled on depose)."""
        term = self._new_term
        if term is None or self.fence is None:
            return self._leading
        with self._lock:
            if self._inflight or self._fencing:
                return False
        self.fence.claim(term)
        self._new_term = None
        self._leading = True
        self.recover()
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.poll_seconds)
            # coalesce a burst of wake-ups (one per webhook) into one tick
            self._stop.wait(MIN_TICK_SECONDS)
            self._wake.clear()
            try:
                if not self._ensure_leading():
                    continue
                delay = self.tick()
            except Exception as exc:
                self._tick_failed(exc)
                continue
            self._errors.succeeded()
            if delay is not None and delay > 0:
                self._stop.wait(min(delay, self.config.poll_seconds))
                self._wake.set()

    def _tick_failed(self, exc: Exception) -> None:
        """A tick failed (the journal's disk full, the API down...): wait a growing while, so a
        fault that repeats every tick is neither a busy loop nor a flood of tracebacks."""
        pause = self._errors.failed()
        self.metrics.worker_errors.inc()
        log.error(
            "worker tick failed (%d in a row; next try in %.1fs): %s",
            self._errors.failures,
            pause,
            exc,
            exc_info=self._errors.failures == 1,  # the traceback once per outage
        )
        self._stop.wait(pause)
        self._wake.set()

    # recovery ---------------------------------------------------------------------------------
    def recover(self) -> list[int]:
        """Resume what a dead runner left behind; returns the interrupted run ids."""
        interrupted = []
        with self._lock:
            ours = set(self._inflight) | set(self._fencing)
        for run in self.journal.runs(RunStatus.RUNNING):
            # A run of this worker still under way is not a leftover. Without leader election the
            # PID says it too; with it, replicas in pods all run as PID 1, so only the in-flight
            # maps can tell.
            if run.id in ours or (self.fence is None and run.owner_pid == os.getpid()):
                continue
            if run.source == "manual" and self._owner_alive(run):
                continue
            for pid in {run.play_pid or 0, *find_plays(run.private_dir)} - {0}:
                stop_play(pid, since=run.started_at)
            self._ingest(run)
            with self.journal.transaction() as tx:
                tx.update_run(
                    run.id,
                    status=RunStatus.INTERRUPTED,
                    finished_at=tx.now,
                    detail="runner stopped during the run; resumed",
                )
                for iid in run.incident_ids:
                    inc = tx.get(iid)
                    if inc is not None and inc.state is IncidentState.RUNNING:
                        tx.transition(iid, IncidentState.ADMITTED, inc.reason)
                        tx.timeline(iid, "resumed", "ok", source="runner", run_id=run.id)
            interrupted.append(run.id)
        return interrupted

    @staticmethod
    def _owner_alive(run: RunRecord) -> bool:
        """The process that started a run by hand (`autoheal run`) still runs: it started before
        the run did (a later process reusing its PID did not)."""
        return proc.started_within(run.owner_pid, before=run.started_at)

    # one tick ---------------------------------------------------------------------------------
    def tick(self) -> float | None:
        """Do what can be done now; returns seconds until a batch window closes, if waiting."""
        now = time.time()
        self._prune(now)
        self._cancel_uncordoned(now)
        self._apply_cancels()
        if self.journal.setting(PAUSE_KEY, False):
            return None
        pending = self.journal.incidents([IncidentState.PENDING])
        wait: float | None = None
        if pending:
            oldest = min(i.opened_at for i in pending)
            left = self.config.batch_window_seconds - (now - oldest)
            if left > 0 and not self._lone(pending):
                wait = left
            else:
                decisions, tripped = self.policy.decide(pending, now)
                self._apply(decisions, tripped, {i.id: i for i in pending})
        self._start_batches()
        with self._lock:  # one spare-exhaustion page per pool, once the storm's runs are over
            busy = bool(self._inflight or self._fencing)
        self.shortage.flush(busy)
        return wait

    def _lone(self, pending: list[IncidentRecord]) -> bool:
        """One incident and nothing else under way: no batch to gather, so it skips the batch
        window (0.3 s off its fence, bench/detection.py). A storm's alerts come in one
        Alertmanager POST (one group) and still wait for their window."""
        with self._lock:
            busy = bool(self._inflight or self._fencing)
        return len(pending) == 1 and not busy

    def _prune(self, now: float) -> None:
        """Once an hour, forget closed incidents past `journal_retention_days`: the journal is the
        queue, and a queue that only grows slows every read of it."""
        days = self.config.journal_retention_days
        if not days or now - self._pruned < PRUNE_EVERY_SECONDS:
            return
        self._pruned = now
        gone = self.journal.prune(now - days * 86400)
        if gone:
            log.info("journal: pruned %d incident(s) closed more than %g days ago", gone, days)

    def _cancel_uncordoned(self, now: float) -> None:
        """Uncordoning a node by hand cancels its incident (docs/architecture.md, "Safety"). A
        fenced node still labelled quarantined but schedulable again means a human took over; the
        runner stops (a running play is cancelled) and says so, instead of fighting them."""
        every = self.config.uncordon_check_seconds
        if not every or now - self._uncordon_checked < every:
            return
        self._uncordon_checked = now
        open_ = [i for i in self.journal.incidents(IN_REMEDIATION) if not i.cancel_requested]
        if not open_:
            return
        try:
            nodes = self.policy.kube.uncordoned(self.config.quarantine_label)
        except RemediationError as exc:
            log.warning("cannot look for nodes uncordoned by hand: %s", exc)
            return
        for inc in open_:
            if inc.node in nodes and "fenced" in self.journal.done_phases(inc.id):
                log.warning("node %s was uncordoned by hand: cancelling incident %s", inc.node, inc.id)
                with self.journal.transaction() as tx:
                    tx.mark(inc.id, cancel_requested=True)
                    tx.timeline(
                        inc.id, "cancel_requested", "ok", source="runner", detail="node uncordoned by hand"
                    )

    def _apply_cancels(self) -> None:
        for inc in self.journal.cancel_requests():
            if inc.cancel_requested:
                with self.journal.transaction() as tx:
                    tx.transition(inc.id, IncidentState.CANCELLED, "cancelled by on-call")
                    tx.timeline(inc.id, "cancelled", "ok", source="cli")
                self._closed(inc, IncidentState.CANCELLED, "cancelled by on-call")

    def _apply(
        self, decisions: list[Decision], tripped: str | None, incidents: dict[str, IncidentRecord]
    ) -> None:
        with self.journal.transaction() as tx:
            if tripped:
                tx.set_setting(
                    BREAKER_KEY, {"open": True, "reason": tripped, "tripped_at": tx.now}, actor="policy"
                )
            for d in decisions:
                if d.action == "wait":
                    continue
                if d.action == "notify":
                    tx.transition(d.incident_id, IncidentState.NOTIFIED, d.reason, dry_run=d.dry_run)
                    tx.timeline(d.incident_id, "notified", "ok", source="runner", detail=d.reason)
                else:  # held by a budget, or admitted to run: the same record, another state
                    state = IncidentState.HELD if d.action == "hold" else IncidentState.ADMITTED
                    tx.transition(
                        d.incident_id, state, d.reason, tier=d.tier, opt_out=d.opt_out, dry_run=d.dry_run
                    )
                    tx.timeline(d.incident_id, state.value, "ok", source="runner", detail=d.reason)
        crash_point("decided")
        for d in decisions:
            self.metrics.decisions.labels(action=d.action).inc()
            inc = incidents[d.incident_id]
            if d.action == "notify":
                self._closed(inc, IncidentState.NOTIFIED, d.reason, tier=d.tier)
            elif d.action == "quarantine":
                self.notifier.send(
                    "incident.quarantined", incident=inc.id, node=inc.node, tier=d.tier, reason=d.reason
                )
        if tripped:
            # one page for the storm, not one per held incident
            held = sum(1 for d in decisions if d.action == "hold")
            log.warning("circuit breaker tripped: %s (%d incidents held)", tripped, held)
            self.notifier.send("breaker.tripped", reason=tripped, held=held)

    # batches ----------------------------------------------------------------------------------
    def _start_batches(self) -> None:
        admitted = self.journal.incidents([IncidentState.ADMITTED])
        groups = self._group(admitted)
        self._fence_tried &= {i.id for i in admitted}
        fence_first = self._fence_first(groups)
        waiting: dict[BatchKey, list[IncidentRecord]] = defaultdict(list)
        for key, members in groups.items():
            if fence_first:
                waiting[key] = [i for i in members if i.id not in self._fence_tried]
                members = [i for i in members if i.id in self._fence_tried]
            for start in range(0, len(members), self.config.max_batch):
                with self._lock:
                    if len(self._inflight) >= self.config.max_concurrent_runs:
                        break
                self._launch(key, members[start : start + self.config.max_batch], RunKind.FULL)
        self._start_fences(waiting)
        if self.config.budgets.fence_held_nodes:
            self._fence_held()

    def _fence_held(self) -> None:
        """Past the budget the breaker holds incidents. With `budgets.fence_held_nodes` their nodes
        are still fenced - drain + cordon in fence-only runs, which stop at `fenced`: no job is
        signalled, no spare taken, nothing destructive - so a storm bigger than the budget (a bad
        driver push, a whole row) keeps new jobs off every failed GPU. The incidents stay held:
        the rest of each runbook waits for a human to reset the breaker."""
        every = self.journal.incidents([IncidentState.HELD])
        self._held_fenced &= {i.id for i in every}  # a reset breaker sends them back to pending
        held = [i for i in every if i.id not in self._held_fenced]
        for key, members in self._group(held).items():
            for start in range(0, len(members), self.config.max_fence_batch):
                with self._lock:
                    if len(self._fencing) >= self.config.max_concurrent_fences:
                        return
                batch = members[start : start + self.config.max_fence_batch]
                self._held_fenced.update(i.id for i in batch)
                self._launch(key, batch, RunKind.FENCE)

    def _group(self, admitted: list[IncidentRecord]) -> dict[BatchKey, list[IncidentRecord]]:
        """Admitted incidents that can start now, by batch; one incident per node per batch."""
        groups: dict[BatchKey, list[IncidentRecord]] = defaultdict(list)
        for inc in admitted:
            with self._lock:
                if inc.node in self._inflight_nodes:
                    continue
            if self.executor.locks.busy(inc.node):  # e.g. `autoheal run` by hand
                continue
            key = BatchKey.of(inc)
            if all(i.node != inc.node for i in groups[key]):
                groups[key].append(inc)
        return groups

    def _fence_first(self, groups: dict[BatchKey, list[IncidentRecord]]) -> bool:
        """A storm (more unfenced nodes than one batch, or a storm being fenced right now) or every
        slot busy: fence them all first in fence-only runs; full runs take the fenced ones as slots
        free up (see the module docstring)."""
        unfenced = sum(1 for m in groups.values() for i in m if i.id not in self._fence_tried)
        with self._lock:
            free = max(0, self.config.max_concurrent_runs - len(self._inflight))
            storm_fencing = bool(self._fencing)
        return (
            self.config.max_concurrent_fences > 0
            and unfenced > 0
            and (free == 0 or unfenced > self.config.max_batch or storm_fencing)
        )

    def _start_fences(self, waiting: dict[BatchKey, list[IncidentRecord]]) -> None:
        """Fence first (see the module docstring): fence now what cannot start a full run now."""
        for key, members in waiting.items():
            for start in range(0, len(members), self.config.max_fence_batch):
                with self._lock:
                    if len(self._fencing) >= self.config.max_concurrent_fences:
                        return
                self._launch(key, members[start : start + self.config.max_fence_batch], RunKind.FENCE)

    def _launch(self, key: BatchKey, batch: list[IncidentRecord], kind: RunKind) -> None:
        nodes = [i.node for i in batch]
        with self.journal.transaction() as tx:
            run_id = tx.create_run(
                playbook=key.playbook,
                incident_ids=[i.id for i in batch],
                nodes=nodes,
                check_mode=key.dry_run,
                source=kind.value,
            )
            events = self.executor.events_path(run_id)
            tx.update_run(run_id, private_dir=str(self.executor.run_dir(run_id)), events_path=str(events))
            if kind is RunKind.FULL:  # a fenced incident stays admitted: its full run is still to come
                for inc in batch:
                    tx.transition(inc.id, IncidentState.RUNNING, inc.reason, run_id=run_id)
        crash_point("run_created")
        if kind is RunKind.FENCE:
            log.info("fence first: run %s fences %d node(s) before their full runs", run_id, len(nodes))
        with self._lock:
            self._inflight_nodes.update(nodes)
            if kind is RunKind.FENCE:
                self._fencing[run_id] = self._fence_pool.submit(self._run, run_id, batch, kind)
            else:
                self._inflight[run_id] = self._pool.submit(self._run, run_id, batch, kind)

    def _run(self, run_id: int, batch: list[IncidentRecord], kind: RunKind) -> None:
        try:
            self.execute(run_id, batch, kind)
        except NotLeader as exc:  # deposed meanwhile: the new leader resumes the run
            log.warning(
                "run %s (%s) left to the new leader: %s", run_id, ",".join(i.node for i in batch), exc
            )
        except Exception as exc:
            log.exception("run %s crashed", run_id)
            try:  # never leave incidents "running" in silence: fail them and page
                self._record_end(run_id, batch, kind, RunStatus.ERROR, None, f"runner error: {exc}")
            except Exception:
                log.exception("could not record the failure of run %s", run_id)
        finally:
            with self._lock:
                if kind is RunKind.FENCE:
                    self._fencing.pop(run_id, None)
                    self._fence_tried.update(i.id for i in batch)
                else:
                    self._inflight.pop(run_id, None)
                self._inflight_nodes.difference_update(i.node for i in batch)
            self._wake.set()

    def execute(self, run_id: int, batch: list[IncidentRecord], kind: RunKind = RunKind.FULL) -> None:
        """Run one batch under its node locks and close its incidents (a fence-only run closes
        nothing: it records its run and the `fenced` phases)."""
        run = self.journal.require_run(run_id)
        play_vars = self._play_vars(run, batch, kind)
        started = time.time()
        try:
            with self.executor.locks.hold(play_vars.nodes):
                warm = self._warm(run, play_vars)
                if kind is RunKind.FENCE and warm is not None:  # the whole fence-only run
                    outcome = warm.result()
                else:
                    outcome = self.executor.run(
                        run_id,
                        run.playbook,
                        play_vars,
                        on_pid=lambda pid: self._tx_run(run_id, play_pid=pid),
                        on_step=lambda task, host, status, changed, t0, t1: self._step(
                            run_id, task, host, status, changed, t0, t1
                        ),
                        on_tick=lambda: self._tick_run(run_id),
                    )
                    if warm is not None:
                        warm.result()
            crash_point("play_ended")
        except NodeBusyError as exc:
            with self.journal.transaction() as tx:
                tx.update_run(run_id, status=RunStatus.SKIPPED, finished_at=tx.now, detail=str(exc))
                if kind is RunKind.FULL:
                    for inc in batch:
                        if run.source == "manual":  # by hand: tell the human now, never queue it
                            tx.transition(inc.id, IncidentState.FAILED, f"not run: {exc}")
                        else:
                            tx.transition(inc.id, IncidentState.ADMITTED, inc.reason)
            return
        except ExecutionError as exc:
            self._record_end(run_id, batch, kind, RunStatus.ERROR, None, str(exc))
            return
        self.metrics.run_duration.observe(time.time() - started)
        self._record_end(run_id, batch, kind, outcome.status, outcome.rc, outcome.detail)

    def _warm(self, run: RunRecord, play_vars: PlayVars) -> Future[RunOutcome] | None:
        """The fence on the warm path (remediation/warmfence.py), beside the play's start-up: the
        nodes are fenced ~0.3 s after the decision instead of ~2 s, and the play's own fence step
        then finds them fenced. Not for check mode, nor for a rung that does not fence."""
        if (
            self.warm_fence is None
            or play_vars.dry_run
            or play_vars.tier == "restart_app"
            or Path(run.playbook).stem != Path(WARM_PLAYBOOK).stem
        ):
            return None
        warm = self.warm_fence
        play_vars.journal_events.parent.mkdir(parents=True, exist_ok=True)  # before the play makes it

        def fence() -> RunOutcome:
            res = warm.fence(play_vars.extravars())
            self.metrics.warm_fence.labels(outcome="ok" if res.ok else "failed").observe(res.seconds)
            if not res.ok:  # the play fences anyway, only later
                log.warning("run %s: warm fence of %s failed: %s", run.id, ",".join(run.nodes), res.error)
                return RunOutcome(RunStatus.FAILED, 1, f"warm fence: {res.error}"[:500])
            log.info("run %s: warm fence of %s in %.2fs", run.id, ",".join(run.nodes), res.seconds)
            return RunOutcome(RunStatus.SUCCESSFUL, 0, "warm fence")

        return self._warm_pool.submit(fence)

    def _play_vars(self, run: RunRecord, batch: list[IncidentRecord], kind: RunKind) -> PlayVars:
        first = batch[0]
        gpus = {i.gpu for i in batch}
        return PlayVars(
            nodes=tuple(i.node for i in batch),
            incident_ids=tuple(i.id for i in batch),
            xid=first.xid,
            gpu=gpus.pop() if len(gpus) == 1 else None,
            tier=first.tier,
            opt_out=first.opt_out,
            dry_run=first.dry_run,
            grace_seconds=self.config.grace_seconds,
            journal_events=Path(run.events_path),
            done_phases={i.node: self.journal.done_phases(i.id) for i in batch},
            extra={**self.config.play_vars, **first.extra_vars},
            stop_after=kind.stop_after,
            fault_time=min(i.opened_at for i in batch),
        )

    def _record_end(
        self,
        run_id: int,
        batch: list[IncidentRecord],
        kind: RunKind,
        status: RunStatus,
        rc: int | None,
        detail: str,
    ) -> None:
        if kind is RunKind.FENCE:
            self._finish_fence(run_id, status, rc, detail)
        else:
            self._finish(run_id, batch, status, rc, detail)

    def _finish_fence(self, run_id: int, status: RunStatus, rc: int | None, detail: str) -> None:
        """Record a fence-only run. Its incidents stay admitted either way: if it failed, their full
        run fences again and escalates if that fails too."""
        run = self.journal.require_run(run_id)
        self._ingest(run)
        self.metrics.runs.labels(status=status).inc()
        self._tx_run(run_id, status=status, rc=rc, finished_at=time.time(), detail=detail or "fence only")
        if status is not RunStatus.SUCCESSFUL:
            log.warning(
                "fence-only run %s (%d node(s)) ended %s: %s; their full runs fence again",
                run_id,
                len(run.nodes),
                status,
                detail,
            )

    def _tx_run(self, run_id: int, **fields: object) -> None:
        with self.journal.transaction() as tx:
            tx.update_run(run_id, **fields)

    def _step(
        self, run_id: int, task: str, host: str, status: str, changed: bool, t0: float | None, t1: float
    ) -> None:
        with self.journal.transaction() as tx:
            tx.add_step(
                run_id=run_id,
                task=task,
                host=host,
                status=status,
                changed=changed,
                started_at=t0,
                finished_at=t1,
            )

    def _tick_run(self, run_id: int) -> bool:
        """Ingest new phase reports; True (cancel) when every incident of the run is cancelled, or
        when this replica no longer leads."""
        if not self._leading:
            return True
        run = self.journal.run(run_id)
        if run is None:
            return True
        self._ingest(run)
        incs = [self.journal.incident(i) for i in run.incident_ids]
        return any(i is not None and i.cancel_requested for i in incs)

    def _ingest(self, run: RunRecord) -> list[PhaseEvent]:
        if not run.events_path:
            return []
        allowed = {}
        for iid, node in zip(run.incident_ids, run.nodes, strict=True):
            allowed[iid] = node
        events, offset = read_events(Path(run.events_path), run.events_offset, allowed)
        if offset == run.events_offset:
            return []
        opened: dict[str, float] = {}
        # a phase counts once per incident in the metrics: a full run after a fence-only run (or a
        # rerun after a crash) reports `fenced` again
        seen = {iid: set(self.journal.done_phases(iid)) for iid in {ev.incident for ev in events}}
        first: list[PhaseEvent] = []
        with self.journal.transaction() as tx:
            for ev in events:
                tx.timeline(
                    ev.incident, ev.phase, ev.status, source="play", ts=ev.ts, run_id=run.id, detail=ev.detail
                )
                if ev.status == "ok" and ev.phase not in seen[ev.incident]:
                    seen[ev.incident].add(ev.phase)
                    first.append(ev)
                    if ev.incident not in opened:
                        inc = tx.get(ev.incident)
                        opened[ev.incident] = inc.opened_at if inc else ev.ts
            tx.update_run(run.id, events_offset=offset)
        for ev in first:
            crash_point(f"phase:{ev.phase}")
            self.metrics.phase_duration.labels(phase=ev.phase).observe(max(0.0, ev.ts - opened[ev.incident]))
        return events

    def _finish(
        self, run_id: int, batch: list[IncidentRecord], status: RunStatus, rc: int | None, detail: str
    ) -> None:
        run = self.journal.require_run(run_id)
        self._ingest(run)
        self.metrics.runs.labels(status=status).inc()
        closed: list[tuple[IncidentRecord, IncidentState, str]] = []
        with self.journal.transaction() as tx:
            tx.update_run(run_id, status=status, rc=rc, finished_at=tx.now, detail=detail)
            for old in batch:
                inc = tx.get(old.id)
                if inc is None:
                    continue
                failed_phases = _unresolved_failures(self.journal.timeline(inc.id), run_id)
                if inc.cancel_requested:
                    state, reason = IncidentState.CANCELLED, "cancelled by on-call"
                elif status is RunStatus.CANCELLED:
                    # cancelled for another incident of the batch: run again, skipping done phases
                    tx.transition(inc.id, IncidentState.ADMITTED, inc.reason)
                    tx.timeline(inc.id, "requeued_by_cancel", "ok", source="runner", run_id=run_id)
                    continue
                elif status is RunStatus.SUCCESSFUL and not failed_phases:
                    quarantine = inc.reason.startswith("quarantine")
                    state = IncidentState.QUARANTINED if quarantine else IncidentState.COMPLETED
                    reason = inc.reason + (" (dry run)" if inc.dry_run else "")
                    short = self._no_spare(inc.id, run_id)
                    if short is not None and state is IncidentState.COMPLETED:
                        reason = NO_SPARE_REASON + (" (dry run)" if inc.dry_run else "")
                        self.shortage.add(no_spare_pool(short), inc.node, inc.id)
                    if "resolved" not in self.journal.done_phases(inc.id):
                        tx.timeline(inc.id, "resolved", "ok", source="runner", run_id=run_id)
                else:
                    what = f"phase {failed_phases[0]} failed" if failed_phases else f"play {status} (rc={rc})"
                    state, reason = IncidentState.FAILED, f"{what}{': ' + detail if detail else ''}"
                    tx.timeline(inc.id, "escalated", "ok", source="runner", run_id=run_id, detail=reason)
                tx.transition(inc.id, state, reason)
                closed.append((inc, state, reason))
        crash_point("closed")
        for inc, state, reason in closed:
            self._closed(inc, state, reason)

    def _no_spare(self, incident: str, run_id: int) -> str | None:
        """The detail of the run's `no_spare` report for the incident (its pool had no hot spare
        left), or None."""
        found = [
            e.detail
            for e in self.journal.timeline(incident)
            if e.run_id == run_id and e.phase == "no_spare" and e.status == "ok" and e.source == "play"
        ]
        return found[0] if found else None

    def _closed(
        self, inc: IncidentRecord, state: IncidentState, reason: str, tier: str | None = None
    ) -> None:
        self.metrics.incidents.labels(tier=tier or inc.tier, outcome=state).inc()
        if reason.startswith(NO_SPARE_REASON):
            return  # told once per pool by self.shortage, not once per node
        # the sinks' event names (docs/operations.md); "notify" predates the state's name
        event = "incident.notify" if state is IncidentState.NOTIFIED else f"incident.{state}"
        self.notifier.send(
            event, incident=inc.id, node=inc.node, tier=tier or inc.tier, state=state, reason=reason
        )


CLIMBED = "climbed"  # the ladder's report that it moved past a failed rung (recover.yml)


def _unresolved_failures(timeline: list[TimelineEntry], run_id: int) -> list[str]:
    """The play's failed phases of this run that still stand, as "phase (detail)".

    A failure the ladder climbed past is not the incident's outcome: a GPU reset that failed is
    followed by `climbed` and a reboot, and a node the reboot brings back completes. Only the
    failures reported after the run's last `climbed` count."""
    mine = [e for e in timeline if e.run_id == run_id and e.source == "play"]
    last_climb = max((i for i, e in enumerate(mine) if e.phase == CLIMBED and e.status == "ok"), default=-1)
    return [
        e.phase + (f" ({e.detail[:200]})" if e.detail else "")
        for e in mine[last_climb + 1 :]
        if e.status == "failed"
    ]
