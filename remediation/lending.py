"""Lending Slurm nodes to an inference burst, and taking them back (issue 35): the decision core.

GPU nodes stay Kubernetes nodes first. Inference workloads are ordinary Deployments whose pods
carry their own priority class and request `nvidia.com/gpu`; a pool node's slurmd pod claims all
its GPUs, so such a pod stays Pending until a node is lent. This module decides, from what the
loop read (remediation/lender.py), which node moves where; it does no I/O.

A node's side is its label LEND_LABEL (no label: training), and moves only along

    training -> lending -> lent -> returning -> training
                lending -> training   (the burst ended before its jobs did: rolled back)

The label is written before Slurm is changed, so a runner restarting mid-move finds the node's side
on the Node and goes on from there (a lending node not yet drained is drained again).

    state       what holds                             next, when
    training    slurmd runs, Slurm schedules it        lending: inference pods are Pending for more
                                                       GPUs than are free or coming on lent nodes,
                                                       the node is a candidate (below), limits allow
    lending     Slurm DRAIN, reason LEND_REASON; its   lent: no job left on it (slurmd is then
                jobs run to their end                  excluded by the label and leaves);
                                                       past `grace`: its jobs requeued (SIGTERM,
                                                       on_grace=requeue) or waited for (wait);
                                                       training: no inference pod Pending any more
    lent        no slurmd; inference pods run there    returning: no inference pod Pending, none on
                                                       the node for `return_after`, cooldown over
    returning   cordoned; its inference pods evicted   training: no inference pod left on it (label
                                                       off, uncordoned: slurmd comes back)
    training    Slurm DRAIN with LEND_REASON, no job   resume in Slurm (a record that outlived the
                                                       lend, or a crash between label and drain)
    any side,   quarantined by the runbook (an XID)    none while fenced: held where it is
    fenced                                             (below); the side goes on once unfenced

A node the runbook fenced (STATE_LABEL quarantined, or the quarantine taint: an XID on it, lent or
not) is held: whatever its side, the lender makes no move on it - no return, no uncordon, no label
change, no Slurm resume, a move under way stops where it is - and it counts on neither side: its
GPUs are not free for inference (the pods the runbook evicted from it are Pending again and are
demand like any other: the next node is lent within the limits), it is not one of the lent nodes
`max_nodes` counts, and its pool's size for `max_percent` and `min_training` leaves it out. Its
LEND_LABEL stays as it was: a node the runbook retires goes with its Node object and its label
(the replacement is a new Node: no label, training; the lender lends it when inference is short,
the spare keeper and Slurm use it when training is); a node the ladder heals in place comes back
with its label, unfenced, and the lender goes on from there (a lent node with no inference pod
returns after `return_after`; while pods are Pending its GPUs serve them).

Candidates for lending: Ready, in a lendable pool, not quarantined, not a spare, not opted out,
known to Slurm and not drained by anyone (an admin's drain is never taken), not moved within the
cooldown. Idle nodes first, then by `order`: job priority (lowest first), then the time since the
job's last checkpoint (the most recently checkpointed first; a job declares it in its comment,
`checkpoint=<unix seconds>`; unknown last). Limits: at most `max_nodes` lent fleet-wide and
`max_percent` of each pool (rounded down), never fewer than `min_training` training nodes left in a
pool. A burst bigger than that lends up to the limit and says so (`Plan.short`; the loop says it
once per burst). `paused`: no new lend or return starts; moves under way finish. `dry_run`: the
loop plans and journals, changes nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from autoheal.labels import LEND_LENDING, LEND_LENT, LEND_REASON, LEND_RETURNING


class LendState(StrEnum):
    TRAINING = "training"
    LENDING = LEND_LENDING
    LENT = LEND_LENT
    RETURNING = LEND_RETURNING


TRANSITIONS: Mapping[LendState, frozenset[LendState]] = {
    LendState.TRAINING: frozenset({LendState.LENDING}),
    LendState.LENDING: frozenset({LendState.LENT, LendState.TRAINING}),
    LendState.LENT: frozenset({LendState.RETURNING}),
    LendState.RETURNING: frozenset({LendState.TRAINING}),
}


class IllegalMove(ValueError):
    """A move the transition table does not allow (a bug, never a normal outcome)."""


def check_transition(old: LendState, new: LendState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalMove(f"lending: {old.value} -> {new.value} is not a move")


def state_of(label: str | None) -> LendState:
    """The side a node's LEND_LABEL value says; an unknown value reads as lent (the safe side:
    nothing lends it again, and a return brings it back)."""
    if not label:
        return LendState.TRAINING
    try:
        return LendState(label)
    except ValueError:
        return LendState.LENT


CHECKPOINT_COMMENT = re.compile(r"(?:^|[ ,;])checkpoint=(\d{1,12}(?:\.\d+)?)(?=$|[ ,;])")


def checkpoint_of(comment: str) -> float | None:
    """The last checkpoint a job declared in its comment (`checkpoint=<unix seconds>`), or None."""
    m = CHECKPOINT_COMMENT.search(comment)
    return float(m.group(1)) if m else None


@dataclass(frozen=True)
class Job:
    job_id: str
    priority: int
    checkpoint: float | None = None  # when it last checkpointed (Unix seconds), if it says
    completing: bool = False  # ending already (a requeue under way): not requeued again


@dataclass(frozen=True)
class PoolNode:
    """What the core needs of one pool node."""

    name: str
    pool: str
    state: LendState
    gpus: int  # the node's nvidia.com/gpu capacity
    eligible: bool = True  # Ready, not quarantined, not a spare, not opted out
    in_slurm: bool = True  # Slurm has a record of it
    drained: bool = False  # DRAIN or DOWN in Slurm
    reason: str = ""  # Slurm's reason
    busy: bool = False  # jobs allocated on it in Slurm
    jobs: tuple[Job, ...] = ()
    moved_at: float | None = None  # when it last started a move (LEND_MOVED_ANNOTATION)
    inference_gpus: int = 0  # GPUs inference pods on it request (running or bound)
    inference_pods: int = 0
    fenced: bool = False  # the runbook quarantined it (label or taint): held, on neither side

    @property
    def ours_in_slurm(self) -> bool:
        return self.drained and self.reason.startswith(LEND_REASON)


@dataclass(frozen=True)
class Demand:
    """Pending inference pods (their priority class, requesting GPUs, not bound to a node)."""

    pods: int = 0
    gpus: int = 0


ORDER_KEYS = ("priority", "checkpoint")


@dataclass(frozen=True)
class Policy:
    max_nodes: int = 1
    max_percent: float = 50.0
    min_training: int = 1
    cooldown: float = 300.0  # no node moves twice within this
    return_after: float = 120.0  # a lent node idle of inference this long goes back
    grace: float = 120.0  # a lending node's jobs run this long before on_grace
    on_grace: str = "requeue"  # "requeue" (SIGTERM, requeued) | "wait" (they finish)
    order: tuple[str, ...] = ORDER_KEYS
    pools: frozenset[str] = frozenset()  # the lendable pools; empty: every pool
    paused: bool = False


@dataclass(frozen=True)
class Move:
    node: str
    pool: str
    verb: str  # lend | drain | lent | requeue | rollback | return | evict | returned | resume
    old: LendState
    new: LendState
    why: str


@dataclass
class Plan:
    moves: list[Move] = field(default_factory=list)
    short_gpus: int = 0  # GPUs the burst wants beyond what may be lent
    limit: str = ""  # which limit held, when short

    @property
    def short(self) -> bool:
        return self.short_gpus > 0


def _pool_cap(size: int, policy: Policy) -> int:
    return math.floor(size * policy.max_percent / 100.0)


def _cooled(n: PoolNode, policy: Policy, now: float) -> bool:
    return n.moved_at is None or now - n.moved_at >= policy.cooldown


def _rank(n: PoolNode, order: Sequence[str]) -> tuple[object, ...]:
    key: list[object] = [n.busy]
    for word in order:
        if word == "priority":
            key.append(max((j.priority for j in n.jobs), default=0))
        elif word == "checkpoint":
            seen = [j.checkpoint for j in n.jobs]
            known = [c for c in seen if c is not None]
            # the oldest checkpoint among its jobs is what a requeue loses; unknown sorts last
            key.append(-min(known) if known and len(known) == len(seen) else float("inf"))
    key.append(n.name)
    return tuple(key)


def _progress(n: PoolNode, demand: Demand, policy: Policy, now: float) -> Move | None:
    """The next step of a move under way (or the repair of a training node we left drained)."""
    if n.fenced:
        return None  # the runbook's: nothing of ours moves under the healing
    if n.state is LendState.LENDING:
        if n.in_slurm and not n.drained:  # labelled, not drained yet (a restart in between)
            return Move(n.name, n.pool, "drain", n.state, n.state, "lending, not drained in Slurm")
        if not n.busy:
            return Move(n.name, n.pool, "lent", n.state, LendState.LENT, "no job left on it")
        if demand.gpus == 0:
            return Move(n.name, n.pool, "rollback", n.state, LendState.TRAINING, "no inference pod Pending")
        past = n.moved_at is not None and now - n.moved_at >= policy.grace
        running = [j for j in n.jobs if not j.completing]  # a requeued job completes a while
        if past and policy.on_grace == "requeue" and running:
            ids = ",".join(j.job_id for j in running)
            return Move(n.name, n.pool, "requeue", n.state, n.state, f"grace {policy.grace:.0f}s over: {ids}")
        return None
    if n.state is LendState.RETURNING:
        if n.inference_pods:
            return Move(n.name, n.pool, "evict", n.state, n.state, f"{n.inference_pods} inference pod(s)")
        return Move(n.name, n.pool, "returned", n.state, LendState.TRAINING, "no inference pod left on it")
    if n.state is LendState.TRAINING and n.ours_in_slurm and not n.busy:
        return Move(n.name, n.pool, "resume", n.state, n.state, "drained for lending, not lent")
    return None


def _returns(
    nodes: Sequence[PoolNode], demand: Demand, policy: Policy, now: float, idle_since: Mapping[str, float]
) -> list[Move]:
    if demand.pods or policy.paused:
        return []
    out = []
    for n in nodes:
        if n.state is not LendState.LENT or n.fenced or n.inference_pods or not _cooled(n, policy, now):
            continue
        idle = now - idle_since.get(n.name, now)
        if idle >= policy.return_after:
            why = f"no inference pod Pending, none on it for {idle:.0f}s"
            out.append(Move(n.name, n.pool, "return", n.state, LendState.RETURNING, why))
    return out


def _candidate(n: PoolNode, policy: Policy, now: float) -> bool:
    return (
        n.state is LendState.TRAINING
        and n.eligible
        and not n.fenced
        and n.in_slurm
        and not n.drained
        and (not policy.pools or n.pool in policy.pools)
        and _cooled(n, policy, now)
    )


def _lends(
    nodes: Sequence[PoolNode], demand: Demand, policy: Policy, now: float
) -> tuple[list[Move], int, str]:
    """New lends for the GPUs the burst wants beyond those free or coming; (moves, short, limit).
    A fenced node counts on neither side (its GPUs serve no one until the runbook is done)."""
    nodes = [n for n in nodes if not n.fenced]
    away = [n for n in nodes if n.state is not LendState.TRAINING]
    coming = sum(n.gpus for n in away if n.state is LendState.LENDING)
    free = sum(max(n.gpus - n.inference_gpus, 0) for n in away if n.state is LendState.LENT)
    need = demand.gpus - coming - free
    if need <= 0 or policy.paused:
        return [], 0, ""
    lent_total = len(away)
    per_pool: dict[str, list[PoolNode]] = {}
    for n in nodes:
        per_pool.setdefault(n.pool, []).append(n)
    out: list[Move] = []
    limit = "no lendable node (idle or busy, out of cooldown, not drained)"
    for n in sorted((n for n in nodes if _candidate(n, policy, now)), key=lambda n: _rank(n, policy.order)):
        if need <= 0:
            break
        members = per_pool[n.pool]
        pool_away = sum(1 for m in members if m.state is not LendState.TRAINING)
        taken = sum(1 for m in out if m.pool == n.pool)
        training = sum(1 for m in members if m.state is LendState.TRAINING) - taken
        if lent_total + len(out) >= policy.max_nodes:
            limit = f"max_nodes {policy.max_nodes} lent"
            break
        if pool_away + taken + 1 > _pool_cap(len(members), policy):
            limit = f"max_percent {policy.max_percent:g}% of pool {n.pool} ({len(members)} nodes)"
            continue
        if training - 1 < policy.min_training:
            limit = f"min_training {policy.min_training} of pool {n.pool}"
            continue
        why = f"{demand.pods} inference pod(s) Pending for {demand.gpus} GPU(s); " + (
            "idle" if not n.busy else f"jobs {','.join(j.job_id for j in n.jobs) or '?'}"
        )
        out.append(Move(n.name, n.pool, "lend", n.state, LendState.LENDING, why))
        need -= max(n.gpus, 1)
    return out, max(need, 0), limit if need > 0 else ""


def plan(
    nodes: Iterable[PoolNode],
    demand: Demand,
    policy: Policy,
    now: float,
    idle_since: Mapping[str, float] | None = None,
) -> Plan:
    """Every move for this pass: moves under way advanced first, then returns, then lends.
    `idle_since`: node -> since when it has had no inference pod (kept by the loop)."""
    listed = sorted(nodes, key=lambda n: n.name)
    moves = [m for n in listed if (m := _progress(n, demand, policy, now)) is not None]
    moves += _returns(listed, demand, policy, now, idle_since or {})
    lends, short, limit = _lends(listed, demand, policy, now)
    for m in moves + lends:
        if m.new is not m.old:
            check_transition(m.old, m.new)
    return Plan(moves + lends, short, limit)


def update_idle(idle_since: dict[str, float], nodes: Iterable[PoolNode], now: float) -> None:
    """Keep node -> since when a lent node has had no inference pod (dropped once it has one or
    is no longer lent)."""
    lent_idle = {n.name for n in nodes if n.state is LendState.LENT and not n.inference_pods and not n.fenced}
    for name in list(idle_since):
        if name not in lent_idle:
            del idle_since[name]
    for name in lent_idle:
        idle_since.setdefault(name, now)
