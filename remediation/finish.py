"""A run's end: record its status and close its incidents from the play's own phase reports.

A full run closes each incident completed, quarantined, failed or cancelled (or puts it back as
admitted when the run was cancelled for another incident of its batch); a fence-only run closes
nothing, its incidents stay admitted for their full runs.
"""

from __future__ import annotations

import logging
import time

from remediation.closing import NO_SPARE_REASON, Closings
from remediation.crashpoints import crash_point
from remediation.inflight import RunKind
from remediation.ingest import ingest
from remediation.journal import IncidentRecord, Journal, TimelineEntry
from remediation.metrics import Metrics
from remediation.notify import no_spare_pool
from remediation.states import IncidentState, RunStatus

log = logging.getLogger(__name__)
CLIMBED = "climbed"  # the ladder's report that it moved past a failed rung (recover.yml)


class Finish:
    def __init__(self, journal: Journal, metrics: Metrics, closings: Closings) -> None:
        self.journal = journal
        self.metrics = metrics
        self.closings = closings

    def record_end(
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
        ingest(run, self.journal, self.metrics)
        self.metrics.runs.labels(status=status).inc()
        with self.journal.transaction() as tx:
            said = detail or "fence only"
            tx.update_run(run_id, status=status, rc=rc, finished_at=time.time(), detail=said)
        if status is not RunStatus.SUCCESSFUL:
            log.warning(
                "fence-only run %s (%d node(s)) ended %s: %s; their full runs fence again",
                run_id,
                len(run.nodes),
                status,
                detail,
            )

    def _finish(
        self, run_id: int, batch: list[IncidentRecord], status: RunStatus, rc: int | None, detail: str
    ) -> None:
        run = self.journal.require_run(run_id)
        ingest(run, self.journal, self.metrics)
        self.metrics.runs.labels(status=status).inc()
        closed: list[tuple[IncidentRecord, IncidentState, str]] = []
        with self.journal.transaction() as tx:
            tx.update_run(run_id, status=status, rc=rc, finished_at=tx.now, detail=detail)
            for old in batch:
                inc = tx.get(old.id)
                if inc is None:
                    continue
                failed_phases = unresolved_failures(self.journal.timeline(inc.id), run_id)
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
                        self.closings.shortage.add(no_spare_pool(short), inc.node, inc.id)
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
            self.closings.closed(inc, state, reason)

    def _no_spare(self, incident: str, run_id: int) -> str | None:
        """The detail of the run's `no_spare` report for the incident (its pool had no hot spare
        left), or None."""
        found = [
            e.detail
            for e in self.journal.timeline(incident)
            if e.run_id == run_id and e.phase == "no_spare" and e.status == "ok" and e.source == "play"
        ]
        return found[0] if found else None


def unresolved_failures(timeline: list[TimelineEntry], run_id: int) -> list[str]:
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
