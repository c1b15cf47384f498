"""A run's life: launch a batch (its journal row, its thread), run its play under the batch's node
locks (beside the warm fence), ingest its phase reports while it runs, and hand its end to Finish.

Full runs and fence-only runs have pools of their own, so a storm's fences never wait behind
full runbooks (fence first: remediation/batches.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from remediation.config import RunnerConfig
from remediation.crashpoints import crash_point
from remediation.errors import ExecutionError, NodeBusyError, NotLeader
from remediation.executor import Executor, PlayVars, RunOutcome
from remediation.finish import Finish
from remediation.inflight import InFlight, RunKind
from remediation.ingest import ingest
from remediation.journal import IncidentRecord, Journal, RunRecord
from remediation.kernel_lines import write_for_run
from remediation.metrics import Metrics
from remediation.states import IncidentState, RunStatus
from remediation.warmfence import PLAYBOOK as WARM_PLAYBOOK
from remediation.warmfence import WarmFence

log = logging.getLogger(__name__)


class Runs:
    def __init__(
        self,
        config: RunnerConfig,
        journal: Journal,
        executor: Executor,
        metrics: Metrics,
        finish: Finish,
        inflight: InFlight,
        *,
        leading: Callable[[], bool],
        wake: Callable[[], None],
        warm_fence: WarmFence | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.executor = executor
        self.metrics = metrics
        self.finish = finish
        self.inflight = inflight
        self.warm_fence = warm_fence
        self._leading = leading  # a deposed replica cancels its plays (their runs are resumed)
        self._wake = wake  # a run's end frees a slot: the worker's loop looks again
        self._pool = ThreadPoolExecutor(config.max_concurrent_runs, "autoheal-run")
        self._fence_pool = ThreadPoolExecutor(max(1, config.max_concurrent_fences), "autoheal-fence")
        # one thread per warm fence process (remediation/warmfence.py: one per fence slot)
        self._warm_pool = ThreadPoolExecutor(max(1, config.max_concurrent_fences), "autoheal-warm-fence")

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._fence_pool.shutdown(wait=True, cancel_futures=True)
        self._warm_pool.shutdown(wait=True, cancel_futures=True)

    # launch -----------------------------------------------------------------------------------
    def launch(self, playbook: str, check_mode: bool, batch: list[IncidentRecord], kind: RunKind) -> None:
        """Record a run of the batch and start it on its pool."""
        nodes = [i.node for i in batch]
        with self.journal.transaction() as tx:
            run_id = tx.create_run(
                playbook=playbook,
                incident_ids=[i.id for i in batch],
                nodes=nodes,
                check_mode=check_mode,
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
        pool = self._fence_pool if kind is RunKind.FENCE else self._pool
        self.inflight.launch(run_id, kind, nodes, lambda: pool.submit(self._run, run_id, batch, kind))

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
                self.finish.record_end(run_id, batch, kind, RunStatus.ERROR, None, f"runner error: {exc}")
            except Exception:
                log.exception("could not record the failure of run %s", run_id)
        finally:
            try:
                self.inflight.land(run_id, kind, [i.id for i in batch], [i.node for i in batch])
            finally:
                self._wake()

    # run --------------------------------------------------------------------------------------
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
            self.finish.record_end(run_id, batch, kind, RunStatus.ERROR, None, str(exc))
            return
        self.metrics.run_duration.observe(time.time() - started)
        self.finish.record_end(run_id, batch, kind, outcome.status, outcome.rc, outcome.detail)

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
            kernel_lines=self._kernel_lines(run, batch) if kind is RunKind.FULL else None,
        )

    def _kernel_lines(self, run: RunRecord, batch: list[IncidentRecord]) -> Path | None:
        """The watcher's kernel lines of the batch, for the evidence bundles (a full run's)."""
        if not run.events_path:
            return None
        return write_for_run(self.journal, Path(run.events_path).parent, [(i.node, i.id) for i in batch])

    # while it runs ----------------------------------------------------------------------------
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
        if not self._leading():
            return True
        run = self.journal.run(run_id)
        if run is None:
            return True
        ingest(run, self.journal, self.metrics)
        incs = [self.journal.incident(i) for i in run.incident_ids]
        return any(i is not None and i.cancel_requested for i in incs)
