"""Telling that an incident closed: count it by tier and outcome, and notify the sinks, except
for a pool out of spares, which gets one page per pool (SpareShortage), not one per node."""

from __future__ import annotations

from remediation.journal import IncidentRecord
from remediation.metrics import Metrics
from remediation.notify import Notifier, SpareShortage
from remediation.states import IncidentState

# A pool out of hot spares is capacity, not a failed remediation (docs/runbook.md): the incident
# completes with this reason and the pool's one `pool.spares_exhausted` notification covers it.
NO_SPARE_REASON = "no spare: jobs wait for capacity"


class Closings:
    def __init__(self, metrics: Metrics, notifier: Notifier) -> None:
        self.metrics = metrics
        self.notifier = notifier
        self.shortage = SpareShortage(notifier.send)

    def closed(self, inc: IncidentRecord, state: IncidentState, reason: str, tier: str | None = None) -> None:
        self.metrics.incidents.labels(tier=tier or inc.tier, outcome=state).inc()
        if reason.startswith(NO_SPARE_REASON):
            return  # told once per pool by self.shortage, not once per node
        # the sinks' event names (docs/operations.md); "notify" predates the state's name
        event = "incident.notify" if state is IncidentState.NOTIFIED else f"incident.{state}"
        self.notifier.send(
            event, incident=inc.id, node=inc.node, tier=tier or inc.tier, state=state, reason=reason
        )
