"""One round of the worker (a tick): housekeeping, on-call cancels, the policy's decisions on
pending incidents once their batch window closes, then batching (remediation/batches.py).

The round applies decisions in one journal transaction and then tells: the metrics, the sinks,
one page for a tripped breaker, one per pool out of spares once the storm's runs are over.
"""

from __future__ import annotations

import logging
import time

from remediation.batches import Batches
from remediation.closing import Closings
from remediation.config import RunnerConfig
from remediation.crashpoints import crash_point
from remediation.domains import JOINED
from remediation.errors import RemediationError
from remediation.inflight import InFlight
from remediation.journal import IncidentRecord, Journal
from remediation.metrics import Metrics
from remediation.notify import Notifier
from remediation.policy import BACKEND_VAR, BREAKER_KEY, PAUSE_KEY, Decision, Policy
from remediation.states import IN_REMEDIATION, IncidentState

log = logging.getLogger(__name__)
PRUNE_EVERY_SECONDS = 3600.0


class Round:
    def __init__(
        self,
        config: RunnerConfig,
        journal: Journal,
        policy: Policy,
        metrics: Metrics,
        notifier: Notifier,
        closings: Closings,
        batches: Batches,
        inflight: InFlight,
    ) -> None:
        self.config = config
        self.journal = journal
        self.policy = policy
        self.metrics = metrics
        self.notifier = notifier
        self.closings = closings
        self.batches = batches
        self.inflight = inflight
        self._uncordon_checked = 0.0
        self._pruned = 0.0  # the first tick prunes

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
        self.batches.start()
        # one spare-exhaustion page per pool, once the storm's runs are over
        self.closings.shortage.flush(self.inflight.busy)
        return wait

    def _lone(self, pending: list[IncidentRecord]) -> bool:
        """One incident and nothing else under way: no batch to gather, so it skips the batch
        window (0.3 s off its fence, bench/detection.py). A storm's alerts come in one
        Alertmanager POST (one group) and still wait for their window."""
        return len(pending) == 1 and not self.inflight.busy

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
                self.closings.closed(inc, IncidentState.CANCELLED, "cancelled by on-call")

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
                    tx.transition(
                        d.incident_id, IncidentState.NOTIFIED, d.reason, dry_run=d.dry_run, tier=d.tier
                    )
                    tx.timeline(d.incident_id, "notified", "ok", source="runner", detail=d.reason)
                elif d.action == "join":  # one incident per failure domain: no page of its own
                    tx.transition(
                        d.incident_id, IncidentState.NOTIFIED, d.reason, dry_run=d.dry_run, tier=d.tier
                    )
                    tx.timeline(d.incident_id, JOINED, "ok", source="runner", detail=d.joins)
                else:  # held by a budget, or admitted to run: the same record, another state
                    state = IncidentState.HELD if d.action == "hold" else IncidentState.ADMITTED
                    fields: dict[str, object] = {"tier": d.tier, "opt_out": d.opt_out, "dry_run": d.dry_run}
                    if d.backend is not None:
                        fields["extra_vars"] = {**incidents[d.incident_id].extra_vars, BACKEND_VAR: d.backend}
                    tx.transition(d.incident_id, state, d.reason, **fields)
                    tx.timeline(d.incident_id, state.value, "ok", source="runner", detail=d.reason)
        crash_point("decided")
        for d in decisions:
            self.metrics.decisions.labels(action=d.action).inc()
            inc = incidents[d.incident_id]
            if d.action == "notify":
                self.closings.closed(inc, IncidentState.NOTIFIED, d.reason, tier=d.tier)
            elif d.action == "join":
                self.metrics.incidents.labels(tier=d.tier, outcome=IncidentState.NOTIFIED).inc()
            elif d.action == "quarantine":
                self.notifier.send(
                    "incident.quarantined", incident=inc.id, node=inc.node, tier=d.tier, reason=d.reason
                )
        if tripped:
            # one page for the storm, not one per held incident
            held = sum(1 for d in decisions if d.action == "hold")
            log.warning("circuit breaker tripped: %s (%d incidents held)", tripped, held)
            self.notifier.send("breaker.tripped", reason=tripped, held=held)
