"""A run's phase reports into the journal: the play appends JSON lines to the run's events file;
each new line becomes a timeline entry of its incident, and a phase reported ok for the first
time is observed in `autoheal_incident_phase_duration_seconds`.

Used while a run is under way, when it ends, and by recovery for a run a dead runner left behind.
"""

from __future__ import annotations

from pathlib import Path

from remediation.crashpoints import crash_point
from remediation.executor import PhaseEvent, read_events
from remediation.journal import Journal, RunRecord
from remediation.metrics import Metrics


def ingest(run: RunRecord, journal: Journal, metrics: Metrics) -> list[PhaseEvent]:
    """Record the reports the run's play added since the last call; returns them."""
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
    seen = {iid: set(journal.done_phases(iid)) for iid in {ev.incident for ev in events}}
    first: list[PhaseEvent] = []
    with journal.transaction() as tx:
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
        metrics.phase_duration.labels(phase=ev.phase).observe(max(0.0, ev.ts - opened[ev.incident]))
    return events
