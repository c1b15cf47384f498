"""Policy: may the runner act on this incident now, and how forcefully?

The order of checks is the order of harm avoided:
  notify tier     -> tell a human, run nothing;
  per-node cap    -> a node failing more than K times in a window is quarantined (fence + page),
                     no more automatic loops;
  escalation      -> a `reset` fault repeating past the catalogue's threshold becomes `replace`;
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

from autoheal.xid import Tier, XidCatalog
from remediation.config import RunnerConfig
from remediation.journal import IncidentRecord, Journal
from remediation.kube import KubeView, label_is_set

Action = Literal["admit", "quarantine", "hold", "notify", "wait"]
BREAKER_KEY = "breaker"
PAUSE_KEY = "paused"


@dataclass(frozen=True)
class Decision:
    incident_id: str
    action: Action
    tier: str
    opt_out: bool
    dry_run: bool
    reason: str


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
    def __init__(self, config: RunnerConfig, journal: Journal, kube: KubeView, catalog: XidCatalog) -> None:
        self.config = config
        self.journal = journal
        self.kube = kube
        self.catalog = catalog

    def decide(self, pending: list[IncidentRecord], now: float) -> tuple[list[Decision], str | None]:
        """Decisions for `pending` (oldest first) and, if this round trips the breaker, why."""
        if not pending:
            return [], None
        cfg = self.config
        # targeted reads: the cost of a round does not grow with the fleet (see remediation/kube.py)
        opted = self.kube.nodes_labelled(cfg.opt_out_label)
        opted_pods = self.kube.nodes_with_labelled_pods(cfg.opt_out_label)
        active = self.journal.incidents(["admitted", "running"])
        in_use = {i.node for i in active}
        node_pool = self.kube.pools(cfg.pool_label, {i.node for i in pending})
        pools: Counter[str] = Counter(node_pool.values())
        pool_use: Counter[str] = Counter(node_pool.get(n, "") for n in in_use)
        breaker = breaker_state(self.journal)
        tripped: str | None = None
        out: list[Decision] = []
        count_since = self.journal.count_node_incidents
        for inc in sorted(pending, key=lambda i: (i.opened_at, i.id)):
            tier = Tier(inc.tier)
            dry = cfg.dry_run or inc.rule_dry_run
            if tier is Tier.NOTIFY:
                out.append(
                    Decision(inc.id, "notify", tier.value, False, dry, f"XID {inc.xid} is notify-only")
                )
                continue
            if inc.node in in_use:
                out.append(Decision(inc.id, "wait", tier.value, False, dry, "node already in remediation"))
                continue
            esc = self.catalog.escalation
            repeats = count_since(inc.node, now - esc.window_seconds)
            reason = "admitted"
            if tier is Tier.RESET and repeats >= esc.repeats:
                tier = Tier.REPLACE
                reason = f"escalated to replace: {repeats} incidents in {esc.window_seconds}s"
            labels = opted.get(inc.node, {})
            opt_out = label_is_set(labels, cfg.opt_out_label) or inc.node in opted_pods
            if opt_out:
                reason = "opt-out: " + (
                    "node label" if label_is_set(labels, cfg.opt_out_label) else "labelled pod on the node"
                )
            action: Action = "admit"
            cap = cfg.node_cap
            count = count_since(inc.node, now - cap.window_seconds)
            if count > cap.max_incidents:
                action, opt_out = "quarantine", True
                reason = f"quarantine: {count} incidents in {cap.window_seconds}s (cap {cap.max_incidents})"
            if breaker.open or tripped:
                out.append(
                    Decision(
                        inc.id,
                        "hold",
                        tier.value,
                        opt_out,
                        dry,
                        "circuit breaker open: " + (tripped or breaker.reason),
                    )
                )
                continue
            pool = node_pool.get(inc.node)
            limit = budget_limit(
                cfg.budgets.max_nodes, cfg.budgets.max_pool_percent, pools[pool] if pool else None
            )
            pool_limit_hit = pool is not None and pool_use[pool] + 1 > limit
            if len(in_use) + 1 > cfg.budgets.max_nodes or pool_limit_hit:
                where = f"pool {pool!r}" if pool_limit_hit else "fleet"
                used = pool_use[pool] if pool_limit_hit and pool else len(in_use)
                lim = limit if pool_limit_hit else cfg.budgets.max_nodes
                tripped = (
                    f"storm: budget of {lim} node(s) for {where} in use ({used}) "
                    f"and node {inc.node} needs remediation"
                )
                out.append(
                    Decision(inc.id, "hold", tier.value, opt_out, dry, "circuit breaker open: " + tripped)
                )
                continue
            in_use.add(inc.node)
            if pool:
                pool_use[pool] += 1
            out.append(Decision(inc.id, action, tier.value, opt_out, dry, reason))
        return out, tripped
