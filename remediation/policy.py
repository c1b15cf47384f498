"""Policy: may the runner act on this incident now, and how forcefully?

The order of checks is the order of harm avoided:
  notify tier     -> tell a human, run nothing;
  per-node cap    -> a node failing more than K times in a window is quarantined (fence + page),
                     no more automatic loops;
  escalation      -> a fault repeating on its node past the catalogue's threshold climbs one rung of
                     the recovery ladder (restart_app -> reset -> reboot -> replace; a degraded
                     node's drain -> quarantine, by the fault catalogue's threshold), and an
                     application XID (13, 31) repeating on one GPU is reset and validated;
  failure domain  -> link faults on many nodes of one domain (a leaf switch) at once are one
                     incident for the domain: notified, no node drained (remediation/domains.py);
  opt-out         -> a node label or a labelled pod on the node: fence + notify only;
  circuit breaker -> once open (latched), nothing new runs until a human resets it;
  budgets         -> at most N nodes, and at most P% of the node's pool (never below 1), in
                     remediation at once; demand beyond the budget is a storm: trip the breaker.
Dry run (runner-wide or per rule) is carried into the decision; the play runs in check mode.
Decisions are pure data; the worker applies them in one journal transaction.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from autoheal.faults import FaultCatalog, load_fault_catalog
from autoheal.xid import Tier, XidCatalog
from remediation.config import RunnerConfig
from remediation.domains import DomainCall, Domains
from remediation.journal import IncidentRecord, Journal
from remediation.kubeview import KubeView, label_is_set
from remediation.states import IN_REMEDIATION

Action = Literal["admit", "quarantine", "hold", "notify", "wait", "join"]
BREAKER_KEY = "breaker"
BACKEND_VAR = "autoheal_backend"  # the runbook input naming the pool backend (autoheal.backends)
PAUSE_KEY = "paused"


@dataclass(frozen=True)
class Decision:
    incident_id: str
    action: Action
    tier: str
    opt_out: bool
    dry_run: bool
    reason: str
    # the node's pool's backend (RunnerConfig.pool_backends), when its rule names none: it becomes
    # the incident's autoheal_backend, so a batch never mixes pools of different backends
    backend: str | None = None
    joins: str = ""  # "join": the failure domain's incident this one joins (remediation/domains.py)


@dataclass(frozen=True)
class BreakerState:
    open: bool
    reason: str = ""
    tripped_at: float | None = None
    actor: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"open": self.open, "reason": self.reason, "tripped_at": self.tripped_at, "actor": self.actor}


def breaker_state(journal: Journal) -> BreakerState:
    raw = journal.setting(BREAKER_KEY)
    if not isinstance(raw, dict) or not raw.get("open"):
        return BreakerState(
            open=False, actor=str((raw or {}).get("actor", "")) if isinstance(raw, dict) else ""
        )
    return BreakerState(
        open=True,
        reason=str(raw.get("reason", "")),
        tripped_at=raw.get("tripped_at"),
        actor=str(raw.get("actor", "")),
    )


def budget_limit(max_nodes: int, max_pool_percent: float, pool_size: int | None) -> int:
    """min(N, P% of the pool), never below 1; N alone when the pool is unknown."""
    if pool_size is None:
        return max(1, max_nodes)
    return max(1, min(max_nodes, math.floor(pool_size * max_pool_percent / 100.0)))


class Policy:
    def __init__(
        self,
        config: RunnerConfig,
        journal: Journal,
        kube: KubeView,
        catalog: XidCatalog,
        faults: FaultCatalog | None = None,
    ) -> None:
        self.config = config
        self.journal = journal
        self.kube = kube
        self.catalog = catalog
        self.faults = faults or load_fault_catalog()
        self.domains = Domains(config.failure_domains, journal, kube)

    def decide(self, pending: list[IncidentRecord], now: float) -> tuple[list[Decision], str | None]:
        """Decisions for `pending` (oldest first) and, if this round trips the breaker, why."""
        if not pending:
            return [], None
        rnd = self._read_round(pending)
        calls = self.domains.judge(pending, now)
        ordered = sorted(pending, key=lambda i: (i.opened_at, i.id))
        out = [
            self._domain(inc, c) if (c := calls.get(inc.id)) else self._decide_one(inc, now, rnd)
            for inc in ordered
        ]
        return out, rnd.tripped

    def _domain(self, inc: IncidentRecord, call: DomainCall) -> Decision:
        """A link fault shared by its failure domain: wait for its peers, or one incident for the
        domain (the lead is notified, the rest join it); no node of the domain is drained."""
        dry = self.config.dry_run or inc.rule_dry_run
        if call.call == "wait":
            return Decision(inc.id, "wait", inc.tier, False, dry, call.reason)
        action: Action = "notify" if call.call == "lead" else "join"
        return Decision(inc.id, action, Tier.NOTIFY.value, False, dry, call.reason, joins=call.lead)

    def _read_round(self, pending: list[IncidentRecord]) -> _Round:
        cfg = self.config
        # targeted reads: the cost of a round does not grow with the fleet (see remediation/kubeview.py)
        in_use = {i.node for i in self.journal.incidents(IN_REMEDIATION)}
        node_pool = self.kube.pools(cfg.pool_label, {i.node for i in pending})
        return _Round(
            opted=self.kube.nodes_labelled(cfg.opt_out_label),
            opted_pods=self.kube.nodes_with_labelled_pods(cfg.opt_out_label),
            in_use=in_use,
            node_pool=node_pool,
            pools=Counter(node_pool.values()),
            pool_use=Counter(node_pool.get(n, "") for n in in_use),
            breaker=breaker_state(self.journal),
        )

    def _decide_one(self, inc: IncidentRecord, now: float, rnd: _Round) -> Decision:
        tier = Tier(inc.tier)
        dry = self.config.dry_run or inc.rule_dry_run
        if tier is Tier.NOTIFY:
            return Decision(inc.id, "notify", tier.value, False, dry, f"XID {inc.xid} is notify-only")
        if inc.node in rnd.in_use:
            return Decision(inc.id, "wait", tier.value, False, dry, "node already in remediation")
        tier, action, opt_out, reason = self._classify(inc, tier, now, rnd)
        if rnd.breaker.open or rnd.tripped:
            why = "circuit breaker open: " + (rnd.tripped or rnd.breaker.reason)
            return Decision(inc.id, "hold", tier.value, opt_out, dry, why, self._backend(inc, rnd))
        storm = self._over_budget(inc.node, rnd)
        if storm:
            rnd.tripped = storm
            why = "circuit breaker open: " + storm
            return Decision(inc.id, "hold", tier.value, opt_out, dry, why, self._backend(inc, rnd))
        rnd.claim(inc.node)
        return Decision(inc.id, action, tier.value, opt_out, dry, reason, self._backend(inc, rnd))

    def _backend(self, inc: IncidentRecord, rnd: _Round) -> str | None:
        if BACKEND_VAR in inc.extra_vars:
            return None  # the rule's choice stands
        return self.config.pool_backends.get(rnd.node_pool.get(inc.node, ""))

    def _classify(
        self, inc: IncidentRecord, tier: Tier, now: float, rnd: _Round
    ) -> tuple[Tier, Action, bool, str]:
        """Escalation, opt-out and the per-node cap: (tier, action, opt-out, reason)."""
        cfg = self.config
        esc = self.faults.escalation if tier is Tier.DRAIN else self.catalog.escalation
        repeats = self.journal.count_node_incidents(inc.node, now - esc.window_seconds)
        reason = "admitted"
        diag = self.catalog.diagnose_on_repeat
        if tier is Tier.RESTART_APP and inc.xid in diag.xids:
            since = now - diag.window_seconds
            same_gpu = self._gpu_repeats(inc, diag.xids, since)
            if same_gpu >= diag.repeats:
                tier = Tier.RESET
                reason = f"escalated to reset (diagnostics): XID {inc.xid} {same_gpu} times on GPU {inc.gpu}"
        if tier.next_rung() is not tier and repeats >= esc.repeats:
            tier = tier.next_rung()
            reason = f"escalated to {tier.value}: {repeats} incidents in {esc.window_seconds}s"
        node_opted = label_is_set(rnd.opted.get(inc.node, {}), cfg.opt_out_label)
        opt_out = node_opted or inc.node in rnd.opted_pods
        if opt_out:
            reason = "opt-out: " + ("node label" if node_opted else "labelled pod on the node")
        cap = cfg.node_cap
        count = self.journal.count_node_incidents(inc.node, now - cap.window_seconds)
        if count > cap.max_incidents:
            reason = f"quarantine: {count} incidents in {cap.window_seconds}s (cap {cap.max_incidents})"
            return tier, "quarantine", True, reason
        return tier, "admit", opt_out, reason

    def _gpu_repeats(self, inc: IncidentRecord, xids: tuple[int, ...], since: float) -> int:
        """Incidents of `xids` on the GPU of `inc` since `since` (itself included; manual runs
        do not count)."""
        if inc.gpu is None:
            return 0
        return self.journal.count_gpu_incidents(inc.node, inc.gpu, xids, since)

    def _over_budget(self, node: str, rnd: _Round) -> str | None:
        """Why admitting `node` would exceed the fleet or pool budget (a storm), or None."""
        budgets = self.config.budgets
        pool = rnd.node_pool.get(node)
        limit = budget_limit(budgets.max_nodes, budgets.max_pool_percent, rnd.pools[pool] if pool else None)
        if pool is not None and rnd.pool_use[pool] + 1 > limit:
            where, used, lim = f"pool {pool!r}", rnd.pool_use[pool] if pool else len(rnd.in_use), limit
        elif len(rnd.in_use) + 1 > budgets.max_nodes:
            where, used, lim = "fleet", len(rnd.in_use), budgets.max_nodes
        else:
            return None
        return f"storm: budget of {lim} node(s) for {where} in use ({used}) and node {node} needs remediation"


@dataclass
class _Round:
    """What one decision round reads once (opt-outs, pools, the nodes in remediation, the
    breaker) and what it has admitted or tripped so far."""

    opted: dict[str, dict[str, str]]
    opted_pods: set[str]
    in_use: set[str]
    node_pool: dict[str, str]
    pools: Counter[str]
    pool_use: Counter[str]
    breaker: BreakerState
    tripped: str | None = None

    def claim(self, node: str) -> None:
        self.in_use.add(node)
        if pool := self.node_pool.get(node):
            self.pool_use[pool] += 1
