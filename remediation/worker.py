"""The queue consumer: a loop that runs rounds while this replica leads, and owns the runner lock.

The queue is the journal's incidents table. Each tick (remediation/rounds.py): apply on-call
cancels; unless paused, decide pending incidents (policy), then group admitted incidents that share
a playbook and inputs into batches and start them, fence first in a storm (remediation/batches.py).
A run (remediation/runs.py) plays a batch under its nodes' locks; its end (remediation/finish.py)
closes its incidents (completed, quarantined, failed) from the play's own phase reports. What is
under way lives in one object with its own table of moves (remediation/inflight.py). On start, or
when this replica starts leading, `recover()` resumes the runs a dead runner left behind
(remediation/recovery.py).

This module keeps the worker's lifecycle (the runner lock, the loop, its error backoff) and its
leadership (a new term is taken up once the former term's runs have wound down).
"""

from __future__ import annotations

import fcntl
import logging
import threading
from typing import IO

from autoheal.backoff import Backoff
from remediation.batches import Batches, BatchKey
from remediation.closing import NO_SPARE_REASON, Closings
from remediation.config import RunnerConfig
from remediation.degraded_return import make_return_loop
from remediation.errors import RemediationError
from remediation.executor import Executor
from remediation.fencing import JournalFence
from remediation.finish import Finish
from remediation.inflight import InFlight, RunKind
from remediation.journal import IncidentRecord, Journal
from remediation.leader import Term
from remediation.metrics import Metrics
from remediation.notify import Notifier, SpareShortage
from remediation.owner_loop import make_owner_loop
from remediation.policy import Policy
from remediation.recovery import Recovery
from remediation.rounds import Round
from remediation.runs import Runs
from remediation.warmfence import WarmFence

__all__ = ["NO_SPARE_REASON", "BatchKey", "RunKind", "Worker"]  # their homes moved; old imports work

log = logging.getLogger(__name__)
MIN_TICK_SECONDS = 0.05
MAX_ERROR_BACKOFF_SECONDS = 30.0  # a failing tick is retried at most this far apart


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
        self.journal = journal
        self.policy = policy
        self.executor = executor
        self.metrics = metrics
        self.notifier = notifier
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner_lock: IO[str] | None = None  # flock: one runner per state dir (start())
        self._errors = Backoff(base=config.poll_seconds, cap=MAX_ERROR_BACKOFF_SECONDS)
        self.inflight = InFlight()
        self.closings = Closings(metrics, notifier)
        self.runs = Runs(
            config,
            journal,
            executor,
            metrics,
            Finish(journal, metrics, self.closings),
            self.inflight,
            leading=lambda: self._leading,
            wake=self._wake.set,
            warm_fence=warm_fence,
        )
        batches = Batches(config, journal, executor, self.runs, self.inflight)
        self.round = Round(config, journal, policy, metrics, notifier, self.closings, batches, self.inflight)
        self.recovery = Recovery(journal, metrics, self.inflight, elected=fence is not None)
        # job owners told, fault costs journalled (remediation/owner_loop.py): off without a sink
        self.owners = make_owner_loop(
            config,
            journal,
            metrics,
            notifier,
            lambda nodes: policy.kube.pools(config.pool_label, nodes),
            lambda: self._leading,
        )
        # a node drained for a degraded fault, validated and returned once idle (degraded_return.py)
        self.returns = make_return_loop(config, journal, lambda: self._leading, self._wake.set)

    @property
    def warm_fence(self) -> WarmFence | None:
        return self.runs.warm_fence

    @warm_fence.setter
    def warm_fence(self, warm: WarmFence | None) -> None:
        self.runs.warm_fence = warm  # the runs read it when they start, so a swap before start() holds

    @property
    def shortage(self) -> SpareShortage:
        return self.closings.shortage

    # the rooms' entry points, as before -------------------------------------------------------
    def tick(self) -> float | None:
        """One round (remediation/rounds.py); seconds until a batch window closes, if waiting."""
        return self.round.tick()

    def recover(self) -> list[int]:
        """Resume what a dead runner left behind (remediation/recovery.py); the interrupted run ids."""
        return self.recovery.recover()

    def execute(self, run_id: int, batch: list[IncidentRecord], kind: RunKind = RunKind.FULL) -> None:
        """Run one batch now, in this thread (remediation/runs.py); `autoheal run` uses it."""
        self.runs.execute(run_id, batch, kind)

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
        if self.owners is not None:
            self.owners.start()
        if self.returns is not None:
            self.returns.start()

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
        self.runs.shutdown()
        if self.owners is not None:
            self.owners.stop()
        if self.returns is not None:
            self.returns.stop()
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
        if self.inflight.busy:
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
