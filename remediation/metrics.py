"""Prometheus metrics of the runner, in a registry of its own (several apps can live in one test).

Counters and histograms are updated where things happen; gauges that mirror the journal (queue
depth, breaker, budget in use, pause) are refreshed from it at scrape time, so they are right even
when another process (the CLI) changed the journal.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from remediation.journal import Journal
from remediation.states import IN_REMEDIATION, QUEUED_STATES, IncidentState

PHASE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.webhook_requests = Counter(
            "autoheal_webhook_requests_total", "Webhook deliveries by HTTP status code.", ["code"], registry=r
        )
        self.webhook_latency = Histogram(
            "autoheal_webhook_request_duration_seconds",
            "Time to validate and journal one webhook delivery.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
        )
        self.alerts = Counter(
            "autoheal_alerts_received_total",
            "Alerts received, by what became of them (incident, joined, unrouted, rejected).",
            ["outcome"],
            registry=r,
        )
        self.incidents = Counter(
            "autoheal_incidents_total",
            "Incidents that reached a final state, by tier and outcome.",
            ["tier", "outcome"],
            registry=r,
        )
        self.decisions = Counter(
            "autoheal_policy_decisions_total", "Policy decisions by action.", ["action"], registry=r
        )
        self.phase_duration = Histogram(
            "autoheal_incident_phase_duration_seconds",
            "Time from an incident's receipt to the end of each phase.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.runs = Counter(
            "autoheal_playbook_runs_total", "ansible-runner runs by final status.", ["status"], registry=r
        )
        self.run_duration = Histogram(
            "autoheal_playbook_run_duration_seconds",
            "Duration of one playbook run.",
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.warm_fence = Histogram(
            "autoheal_warm_fence_seconds",
            "Fences on the warm path (no play start-up), request to reply, by outcome.",
            ["outcome"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.notifications = Counter(
            "autoheal_notifications_total",
            "Notifications by sink kind and outcome.",
            ["sink", "outcome"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "autoheal_queue_depth", "Incidents waiting: pending, admitted or held.", registry=r
        )
        self.breaker_open = Gauge(
            "autoheal_circuit_breaker_open", "1 while the circuit breaker is open.", registry=r
        )
        self.paused = Gauge("autoheal_paused", "1 while the runner is paused.", registry=r)
        self.budget_in_use = Gauge(
            "autoheal_budget_nodes_in_use", "Nodes in remediation now (admitted or running).", registry=r
        )
        self.budget_limit = Gauge("autoheal_budget_nodes_limit", "Fleet-wide node budget (N).", registry=r)
        self.worker_errors = Counter(
            "autoheal_worker_errors_total",
            "Worker ticks that failed (journal or API unavailable); retried with growing backoff.",
            registry=r,
        )
        self.leader = Gauge(
            "autoheal_leader", "1 while this replica leads (runs plays); 0 while it follows.", registry=r
        )
        self.leader_changes = Counter(
            "autoheal_leader_changes_total",
            "Times this replica started or stopped leading, by what happened.",
            ["change"],
            registry=r,
        )
        self.pool_spares = Gauge(
            "autoheal_pool_spares",
            "Hot spares of each pool, as the spare keeper last counted them (leader only).",
            ["pool"],
            registry=r,
        )
        self.pool_spares_declared = Gauge(
            "autoheal_pool_spares_declared",
            "Hot spares each pool declares (pool.json).",
            ["pool"],
            registry=r,
        )
        self.spare_keeper_actions = Counter(
            "autoheal_spare_keeper_actions_total",
            "Nodes the spare keeper made (or repaired as) a spare, or made active.",
            ["action"],
            registry=r,
        )
        self.dead_nodes_deleted = Counter(
            "autoheal_dead_nodes_deleted_total",
            "Dynamic Slurm nodes deleted because their Kubernetes Node was gone.",
            registry=r,
        )
        self.lending_nodes = Gauge(
            "autoheal_lending_nodes",
            "Pool nodes on each side of lending (training, lending, lent, returning; leader only).",
            ["state"],
            registry=r,
        )
        self.lending_pending_gpus = Gauge(
            "autoheal_lending_pending_gpus",
            "GPUs the Pending inference pods request (the lender's demand).",
            registry=r,
        )
        self.lending_moves = Counter(
            "autoheal_lending_moves_total",
            "The lender's moves (lend, lent, requeue, rollback, return, evict, returned, resume, drain).",
            ["move"],
            registry=r,
        )
        self.illegal_transitions = Counter(
            "autoheal_illegal_transitions_total",
            "Incident state changes refused by the state machine (a bug or a race; never normal).",
            ["from_state", "to_state"],
            registry=r,
        )

        # what faults cost (remediation/cost.py, remediation/owner_loop.py) and the incidents by class
        self.gpu_hours_lost = Counter(
            "autoheal_gpu_hours_lost_total",
            "GPU-hours faults cost training jobs: GPUs x (fault -> first step after resume) + the work"
            " recomputed since the checkpoint they resumed from.",
            ["pool", "fault_class"],
            registry=r,
        )
        self.job_resumed = Histogram(
            "autoheal_job_resume_seconds",
            "Time from a fault to its job's first step after the resume.",
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.effective_training = Gauge(
            "autoheal_effective_training_ratio",
            "Effective training time of each pool over the cost window:"
            " 1 - GPU-hours lost / (GPUs x window).",
            ["pool"],
            registry=r,
        )
        self.owner_notices = Counter(
            "autoheal_owner_notices_total",
            "Job owners' notices (hit, resumed, waiting) by outcome (sent, refused, on_call, failed).",
            ["kind", "outcome"],
            registry=r,
        )
        self.incidents_by_state = Gauge(
            "autoheal_incidents_recent",
            "Recent incidents (the journal's newest 1000) by state and fault class.",
            ["state", "fault_class"],
            registry=r,
        )

    def count_illegal(self, incident_id: str, current: IncidentState, new: IncidentState) -> None:
        """The journal's hook for a refused transition (remediation/states.py)."""
        del incident_id  # logged by the journal; an id per label value would grow without bound
        self.illegal_transitions.labels(from_state=current.value, to_state=new.value).inc()

    def refresh(self, journal: Journal, budget_limit: int) -> None:
        from remediation.policy import BREAKER_KEY, PAUSE_KEY

        counts = journal.count_states()
        self.queue_depth.set(sum(counts.get(s, 0) for s in QUEUED_STATES))
        self.budget_in_use.set(sum(counts.get(s, 0) for s in IN_REMEDIATION))
        self.budget_limit.set(budget_limit)
        breaker = journal.setting(BREAKER_KEY) or {}
        self.breaker_open.set(1 if isinstance(breaker, dict) and breaker.get("open") else 0)
        self.paused.set(1 if journal.setting(PAUSE_KEY, False) else 0)
        by_class: dict[tuple[str, str], int] = {}
        for inc in journal.incidents():
            by_class[(inc.state, inc.fault_class)] = by_class.get((inc.state, inc.fault_class), 0) + 1
        self.incidents_by_state.clear()  # a state no incident is in any more goes, not kept at its old count
        for (state, fault_class), n in by_class.items():
            self.incidents_by_state.labels(state=state, fault_class=fault_class).set(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
