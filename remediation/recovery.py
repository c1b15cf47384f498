"""Resuming after a restart: runs a dead runner (or a former leader) left "running" in the journal.

For each such run: stop its orphaned ansible-playbook, ingest the phases the play reported before
the crash, mark the run interrupted and put its incidents back as admitted. The rerun gets
`autoheal_done_phases`; the runbook's steps are idempotent, so a finished destructive step finds
nothing to do and is not repeated.
"""

from __future__ import annotations

import os

from autoheal import proc
from remediation.executor import find_plays, stop_play
from remediation.inflight import InFlight
from remediation.ingest import ingest
from remediation.journal import Journal, RunRecord
from remediation.metrics import Metrics
from remediation.states import IncidentState, RunStatus


class Recovery:
    def __init__(self, journal: Journal, metrics: Metrics, inflight: InFlight, *, elected: bool) -> None:
        self.journal = journal
        self.metrics = metrics
        self.inflight = inflight
        self.elected = elected  # with leader election, PIDs cannot tell whose run it is

    def recover(self) -> list[int]:
        """Resume what a dead runner left behind; returns the interrupted run ids."""
        interrupted = []
        ours = self.inflight.run_ids()
        for run in self.journal.runs(RunStatus.RUNNING):
            # A run of this worker still under way is not a leftover. Without leader election the
            # PID says it too; with it, replicas in pods all run as PID 1, so only the in-flight
            # runs can tell.
            if run.id in ours or (not self.elected and run.owner_pid == os.getpid()):
                continue
            if run.source == "manual" and _owner_alive(run):
                continue
            for pid in {run.play_pid or 0, *find_plays(run.private_dir)} - {0}:
                stop_play(pid, since=run.started_at)
            ingest(run, self.journal, self.metrics)
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


def _owner_alive(run: RunRecord) -> bool:
    """The process that started a run by hand (`autoheal run`) still runs: it started before the
    run did (a later process reusing its PID did not)."""
    return proc.started_within(run.owner_pid, before=run.started_at)
