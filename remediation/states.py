"""Incident states and run statuses, and the one table of the moves an incident may make.

An incident is the runner's unit of work; its state is the queue. Every state change goes through
`Tx.transition` (remediation/journal.py), which checks it against `TRANSITIONS` and refuses, logs
and counts (`autoheal_illegal_transitions_total`) anything else, so a bug or a race can never move a
finished incident back into the queue or skip the fence. The same diagram is in
docs/architecture.md ("Incident states")::

                      +--> notified (notify tier: nothing to run)
                      |
    received -> pending --> held (breaker open) --(breaker reset)--> pending
                      |                         \\--> cancelled
                      +--> admitted --> running --> completed | quarantined | failed
                      |        |   ^       |
                      |        |   +-------+  (crash resumed, node busy, batch cancelled)
                      |        +--> failed (could not start: node locked by hand)
                      +--> cancelled  <-- admitted | held | running (on-call cancel)

Closed states (completed, quarantined, failed, cancelled, notified) have no way out: a new alert
after the dedup window opens a new incident.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class IncidentState(StrEnum):
    PENDING = "pending"  # journaled, waiting for the batch window and the policy
    ADMITTED = "admitted"  # the policy let it run; waiting for a run slot and its node lock
    RUNNING = "running"  # a full run of its runbook is in flight
    HELD = "held"  # the circuit breaker is open: a human must reset it
    COMPLETED = "completed"
    FAILED = "failed"  # escalated: a human was paged, the node stays fenced
    CANCELLED = "cancelled"  # on-call cancelled it (or uncordoned the node by hand)
    QUARANTINED = "quarantined"  # fenced and left out of the pool (node over its incident cap)
    NOTIFIED = "notified"  # notify tier: reported, nothing run

    @property
    def is_open(self) -> bool:
        return self in OPEN_STATES


STATES: tuple[str, ...] = tuple(s.value for s in IncidentState)  # the words, as the CLI takes them
OPEN_STATES: tuple[IncidentState, ...] = (
    IncidentState.PENDING,
    IncidentState.ADMITTED,
    IncidentState.RUNNING,
    IncidentState.HELD,
)
CLOSED_STATES: tuple[IncidentState, ...] = tuple(s for s in IncidentState if s not in OPEN_STATES)
# waiting for the worker (the queue depth) and holding a slot of the node budget
QUEUED_STATES = (IncidentState.PENDING, IncidentState.ADMITTED, IncidentState.HELD)
IN_REMEDIATION = (IncidentState.ADMITTED, IncidentState.RUNNING)
# an on-call cancel takes effect at the next tick for these; a running one is cancelled by its run
CANCELLABLE_NOW = (IncidentState.PENDING, IncidentState.ADMITTED, IncidentState.HELD)

S = IncidentState
TRANSITIONS: Mapping[IncidentState, frozenset[IncidentState]] = {
    S.PENDING: frozenset({S.ADMITTED, S.HELD, S.NOTIFIED, S.CANCELLED}),
    S.HELD: frozenset({S.PENDING, S.CANCELLED}),
    S.ADMITTED: frozenset({S.RUNNING, S.CANCELLED, S.FAILED}),
    S.RUNNING: frozenset({S.ADMITTED, S.COMPLETED, S.QUARANTINED, S.FAILED, S.CANCELLED}),
    **{s: frozenset() for s in CLOSED_STATES},
}
# the state a new incident may be created in (a manual run is admitted at once)
INITIAL_STATES = frozenset({S.PENDING, S.ADMITTED})


def allowed(current: IncidentState, new: IncidentState) -> bool:
    """Whether an incident in `current` may move to `new` (the same state is not a move)."""
    return new in TRANSITIONS[current]


class RunStatus(StrEnum):
    """A run's status in the journal (ansible-runner's own words, spelled one way)."""

    RUNNING = "running"
    SUCCESSFUL = "successful"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"  # ansible-runner says "canceled": normalised by from_runner
    ERROR = "error"
    INTERRUPTED = "interrupted"  # the runner died during it; its incidents were resumed
    SKIPPED = "skipped"  # a node was locked (a play run by hand); nothing ran

    @classmethod
    def from_runner(cls, status: str) -> RunStatus:
        """ansible-runner's status word (American "canceled") as ours; unknown words are errors."""
        if status == "canceled":
            return cls.CANCELLED
        try:
            return cls(status)
        except ValueError:
            return cls.ERROR
