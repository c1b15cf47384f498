"""Batching and fence first: admitted incidents into runs, bounded by the run and fence slots.

Admitted incidents that share a playbook and inputs form batches (one incident per node), each a
run under its nodes' locks (at most `max_batch` nodes, `max_concurrent_runs` runs at once).

Fence first: a run is a whole runbook (30 s and more in a storm, most of it waiting for jobs to
checkpoint). When more admitted incidents are unfenced than one batch (a storm; its late arrivals
too, while its fence-only runs are in flight), or every run slot is busy, they would wait unfenced
behind those runs while jobs keep landing on nodes with dead GPUs; and full runs started side by
side fence slowly, competing for CPU with each other's later steps. So the worker fences them all
first, in short fence-only runs (the same play with `autoheal_stop_after=fenced`; at most
`max_concurrent_fences` at once, up to `max_fence_batch` nodes each). The incidents stay admitted
and get their full runs as slots free up (their fence steps then find nothing to change). An
incident that fits a free slot goes straight to its full run, which fences first anyway. Figures
with 500 of 2,000 nodes failing: bench/storm.py. What fence first has done for each incident is
its mark (remediation/inflight.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from remediation.config import RunnerConfig
from remediation.executor import Executor
from remediation.inflight import InFlight, RunKind
from remediation.journal import IncidentRecord, Journal
from remediation.runs import Runs
from remediation.states import IncidentState


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


class Batches:
    def __init__(
        self, config: RunnerConfig, journal: Journal, executor: Executor, runs: Runs, inflight: InFlight
    ) -> None:
        self.config = config
        self.journal = journal
        self.executor = executor
        self.runs = runs
        self.inflight = inflight

    def start(self) -> None:
        """Start what the free slots take: full runs, fence-only runs, held fences."""
        admitted = self.journal.incidents([IncidentState.ADMITTED])
        groups = self._group(admitted)
        self.inflight.keep_fenced({i.id for i in admitted})
        fenced = self.inflight.fenced(i.id for m in groups.values() for i in m)
        fence_first = self._fence_first(groups, fenced)
        waiting: dict[BatchKey, list[IncidentRecord]] = defaultdict(list)
        for key, members in groups.items():
            if fence_first:
                waiting[key] = [i for i in members if i.id not in fenced]
                members = [i for i in members if i.id in fenced]
            for start in range(0, len(members), self.config.max_batch):
                if self.inflight.count(RunKind.FULL) >= self.config.max_concurrent_runs:
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
        self.inflight.keep_held({i.id for i in every})  # a reset breaker sends them back to pending
        done = self.inflight.held_fenced(i.id for i in every)
        held = [i for i in every if i.id not in done]
        for key, members in self._group(held).items():
            for start in range(0, len(members), self.config.max_fence_batch):
                if self.inflight.count(RunKind.FENCE) >= self.config.max_concurrent_fences:
                    return
                batch = members[start : start + self.config.max_fence_batch]
                self.inflight.fence_held(i.id for i in batch)
                self._launch(key, batch, RunKind.FENCE)

    def _group(self, admitted: list[IncidentRecord]) -> dict[BatchKey, list[IncidentRecord]]:
        """Admitted incidents that can start now, by batch; one incident per node per batch."""
        groups: dict[BatchKey, list[IncidentRecord]] = defaultdict(list)
        for inc in admitted:
            if self.inflight.node_busy(inc.node):
                continue
            if self.executor.locks.busy(inc.node):  # e.g. `autoheal run` by hand
                continue
            key = BatchKey.of(inc)
            if all(i.node != inc.node for i in groups[key]):
                groups[key].append(inc)
        return groups

    def _fence_first(self, groups: dict[BatchKey, list[IncidentRecord]], fenced: set[str]) -> bool:
        """A storm (more unfenced nodes than one batch, or a storm being fenced right now) or every
        slot busy: fence them all first in fence-only runs; full runs take the fenced ones as slots
        free up (see the module docstring)."""
        unfenced = sum(1 for m in groups.values() for i in m if i.id not in fenced)
        free = max(0, self.config.max_concurrent_runs - self.inflight.count(RunKind.FULL))
        storm_fencing = self.inflight.count(RunKind.FENCE) > 0
        return (
            self.config.max_concurrent_fences > 0
            and unfenced > 0
            and (free == 0 or unfenced > self.config.max_batch or storm_fencing)
        )

    def _start_fences(self, waiting: dict[BatchKey, list[IncidentRecord]]) -> None:
        """Fence first (see the module docstring): fence now what cannot start a full run now."""
        for key, members in waiting.items():
            for start in range(0, len(members), self.config.max_fence_batch):
                if self.inflight.count(RunKind.FENCE) >= self.config.max_concurrent_fences:
                    return
                self._launch(key, members[start : start + self.config.max_fence_batch], RunKind.FENCE)

    def _launch(self, key: BatchKey, batch: list[IncidentRecord], kind: RunKind) -> None:
        self.runs.launch(key.playbook, key.dry_run, batch, kind)
