"""The lender's decision core (remediation/lending.py): which node is lent to an inference burst,
which comes back, and the limits, cooldowns and the transition table. Pure: no cluster here; the
lend and return on real kubelets with Slurm in pods is tests/k8s_slurm/test_lending.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoheal.labels import LEND_REASON
from remediation.lending import (
    TRANSITIONS,
    Demand,
    IllegalMove,
    Job,
    LendState,
    Move,
    Plan,
    Policy,
    PoolNode,
    check_transition,
    checkpoint_of,
    plan,
    state_of,
    update_idle,
)

T, LENDING, LENT, RET = LendState.TRAINING, LendState.LENDING, LendState.LENT, LendState.RETURNING
NOW = 10_000.0
WIDE = Policy(max_nodes=10, max_percent=100, min_training=0, cooldown=60, return_after=30, grace=20)


def node(name: str, pool: str = "h100", state: LendState = T, gpus: int = 4, **kw: object) -> PoolNode:
    return PoolNode(name, pool, state, gpus, **kw)  # type: ignore[arg-type]


def busy(name: str, *jobs: Job, **kw: object) -> PoolNode:
    return replace(node(name, busy=True, jobs=jobs), **kw)  # type: ignore[arg-type]


def verbs(p: Plan) -> list[tuple[str, str]]:
    return [(m.node, m.verb) for m in p.moves]


def test_the_transition_table_is_the_cycle_and_nothing_else() -> None:
    assert {T: {LENDING}, LENDING: {LENT, T}, LENT: {RET}, RET: {T}} == TRANSITIONS
    for old in LendState:
        for new in LendState:
            if new in TRANSITIONS[old]:
                check_transition(old, new)
            else:
                with pytest.raises(IllegalMove, match=f"{old.value} -> {new.value}"):
                    check_transition(old, new)


def test_the_label_names_the_state_and_an_unknown_value_reads_as_lent() -> None:
    assert [state_of(v) for v in (None, "", "lending", "lent", "returning")] == [T, T, LENDING, LENT, RET]
    assert state_of("banana") is LENT


def test_a_checkpoint_is_read_from_the_jobs_comment_only_in_its_own_form() -> None:
    assert checkpoint_of("progress=/x checkpoint=1700000000") == 1700000000.0
    assert checkpoint_of("checkpoint=1700000000.5,other") == 1700000000.5
    assert checkpoint_of("mycheckpoint=5") is None and checkpoint_of("checkpoint=soon") is None


def test_no_demand_no_move() -> None:
    assert plan([node("a"), node("b")], Demand(), WIDE, NOW).moves == []


def test_idle_nodes_are_lent_first_then_the_lowest_priority_job() -> None:
    nodes = [busy("a", Job("1", 100)), node("b"), busy("c", Job("2", 5)), busy("d", Job("3", 50))]
    p = plan(nodes, Demand(pods=2, gpus=12), WIDE, NOW)
    assert verbs(p) == [("b", "lend"), ("c", "lend"), ("d", "lend")]
    assert all(m.new is LENDING for m in p.moves) and not p.short


def test_between_equal_priorities_the_most_recently_checkpointed_goes_first() -> None:
    nodes = [
        busy("a", Job("1", 5, checkpoint=NOW - 3000)),
        busy("b", Job("2", 5)),  # unknown: last
        busy("c", Job("3", 5, checkpoint=NOW - 60)),
    ]
    assert verbs(plan(nodes, Demand(1, 4), WIDE, NOW)) == [("c", "lend")]
    by_checkpoint_only = replace(WIDE, order=("checkpoint",))
    nodes[2] = busy("c", Job("3", 1, checkpoint=NOW - 60))
    assert verbs(plan(nodes, Demand(1, 8), by_checkpoint_only, NOW)) == [("c", "lend"), ("a", "lend")]


def test_enough_nodes_for_the_gpus_wanted_counting_gpus_coming_and_free() -> None:
    coming = busy("c", Job("1", 1), state=LENDING, moved_at=NOW, drained=True, reason=LEND_REASON)
    nodes = [node("a"), node("b"), coming, node("d", state=LENT, inference_gpus=2)]
    # 10 GPUs wanted: 4 coming on c, 2 free on d -> one more node
    assert verbs(plan(nodes, Demand(3, 10), WIDE, NOW)) == [("a", "lend")]
    # 6 wanted: covered
    assert [m for m in plan(nodes, Demand(2, 6), WIDE, NOW).moves if m.verb == "lend"] == []


def test_never_below_the_pools_minimum_for_training_and_the_limits_are_said() -> None:
    nodes = [node("a"), node("b"), node("c")]
    p = plan(nodes, Demand(5, 40), replace(WIDE, min_training=2), NOW)
    assert verbs(p) == [("a", "lend")]
    assert p.short and p.short_gpus == 36 and p.limit == "min_training 2 of pool h100"


def test_at_most_n_nodes_fleet_wide_and_p_percent_of_each_pool() -> None:
    nodes = [node(f"a{i}") for i in range(4)] + [node(f"b{i}", pool="a100") for i in range(4)]
    p = plan(nodes, Demand(9, 100), replace(WIDE, max_nodes=3, max_percent=25), NOW)
    assert sorted(verbs(p)) == [("a0", "lend"), ("b0", "lend")]  # 25 % of 4 = 1 per pool
    assert p.limit.startswith("max_percent 25%")
    p = plan(nodes, Demand(9, 100), replace(WIDE, max_nodes=3), NOW)
    assert len(p.moves) == 3 and p.limit == "max_nodes 3 lent"
    already = [replace(n, state=LENT, inference_gpus=4) if n.name == "a0" else n for n in nodes]
    assert len(plan(already, Demand(9, 100), replace(WIDE, max_nodes=3), NOW).moves) == 2


def test_only_candidates_are_lent_an_admins_drain_is_never_taken() -> None:
    nodes = [
        node("admin", drained=True, reason="bad fan"),
        node("spare", eligible=False),
        node("unknown", in_slurm=False),
        node("moved", moved_at=NOW - 10),  # within the cooldown
        node("other", pool="a100"),
    ]
    p = plan(nodes, Demand(1, 4), replace(WIDE, pools=frozenset({"h100"})), NOW)
    assert p.moves == [] and p.short and p.limit.startswith("no lendable node")
    assert verbs(plan(nodes, Demand(1, 4), WIDE, NOW)) == [("other", "lend")]


def test_a_lending_node_is_lent_once_its_jobs_end_requeued_past_the_grace_or_rolled_back() -> None:
    waiting = busy("a", Job("7", 1), state=LENDING, moved_at=NOW - 5, drained=True, reason=LEND_REASON)
    # labelled lending, the runner restarted before the drain: drained now
    assert verbs(plan([replace(waiting, drained=False)], Demand(1, 4), WIDE, NOW)) == [("a", "drain")]
    assert plan([waiting], Demand(1, 4), WIDE, NOW).moves == []  # jobs run, within grace
    late = replace(waiting, moved_at=NOW - 25)
    assert verbs(plan([late], Demand(1, 4), WIDE, NOW)) == [("a", "requeue")]
    # requeued, still completing on the node: not requeued again (the next pass came first)
    ending = replace(late, jobs=(Job("7", 1, completing=True),))
    assert plan([ending], Demand(1, 4), WIDE, NOW).moves == []
    assert plan([late], Demand(1, 4), replace(WIDE, on_grace="wait"), NOW).moves == []
    done = replace(late, busy=False, jobs=())
    assert [(m.verb, m.new) for m in plan([done], Demand(1, 4), WIDE, NOW).moves] == [("lent", LENT)]
    # the burst ended before the jobs did: back to training, never a node neither side uses
    assert [(m.verb, m.new) for m in plan([late], Demand(), WIDE, NOW).moves] == [("rollback", T)]


def test_a_lent_node_returns_after_idle_and_cooldown_only_when_nothing_is_pending() -> None:
    lent = node("a", state=LENT, moved_at=NOW - 100)
    idle: dict[str, float] = {}
    update_idle(idle, [lent], NOW - 40)
    assert verbs(plan([lent], Demand(), WIDE, NOW, idle)) == [("a", "return")]
    assert plan([lent], Demand(1, 1), WIDE, NOW, idle).moves == []  # demand: stays
    assert plan([lent], Demand(), WIDE, NOW - 20, idle).moves == []  # idle only 20 s < 30
    assert plan([replace(lent, moved_at=NOW - 50)], Demand(), WIDE, NOW, idle).moves == []  # cooldown
    serving = replace(lent, inference_pods=1, inference_gpus=4)
    update_idle(idle, [serving], NOW)
    assert idle == {} and plan([serving], Demand(), WIDE, NOW, idle).moves == []


def test_a_returning_node_is_emptied_then_given_back_and_a_leftover_drain_resumed() -> None:
    ret = node("a", state=RET, inference_pods=2)
    assert verbs(plan([ret], Demand(), WIDE, NOW)) == [("a", "evict")]
    m = plan([replace(ret, inference_pods=0)], Demand(), WIDE, NOW).moves
    assert [(x.verb, x.new) for x in m] == [("returned", T)]
    leftover = node("a", drained=True, reason=f"{LEND_REASON} (burst)")
    assert verbs(plan([leftover], Demand(), WIDE, NOW)) == [("a", "resume")]
    assert plan([replace(leftover, busy=True)], Demand(), WIDE, NOW).moves == []


def test_flapping_demand_moves_no_node_twice_within_the_cooldown() -> None:
    """Demand on, off, on within the cooldown: the node lent stays lent, the rest stay put."""
    a = node("a")
    p1 = plan([a, node("b")], Demand(1, 4), WIDE, NOW)
    assert verbs(p1) == [("a", "lend")]
    lent = replace(a, state=LENT, moved_at=NOW)
    idle: dict[str, float] = {}
    update_idle(idle, [lent], NOW)
    assert plan([lent, node("b")], Demand(), WIDE, NOW + 40, idle).moves == []  # idle but cooling
    back = replace(a, moved_at=NOW + 61)  # returned at +61
    assert verbs(plan([back, node("b")], Demand(1, 4), WIDE, NOW + 70)) == [("b", "lend")]


def test_pause_finishes_moves_under_way_and_starts_none() -> None:
    paused = replace(WIDE, paused=True)
    nodes = [node("a"), node("b", state=LENDING, moved_at=NOW, drained=True), node("c", state=RET)]
    assert verbs(plan(nodes, Demand(1, 8), paused, NOW)) == [("b", "lent"), ("c", "returned")]
    lent = node("d", state=LENT, moved_at=0)
    assert plan([lent], Demand(), paused, NOW, {"d": 0.0}).moves == []


def test_every_planned_state_change_is_in_the_table() -> None:
    nodes = [node("a"), node("b", state=LENDING), node("c", state=LENT), node("d", state=RET)]
    for demand in (Demand(), Demand(1, 4)):
        for m in plan(nodes, demand, WIDE, NOW, {"c": 0.0}).moves:
            assert isinstance(m, Move) and (m.new is m.old or m.new in TRANSITIONS[m.old])


# -- a node the runbook fenced (an XID on a lent node, issue 35 deliver 2) ---------------------


def test_a_fenced_lent_node_is_never_returned_uncordoned_or_relabelled() -> None:
    """Evicted by the runbook, idle, cooled and long idle: a plain lent node would go back; a
    fenced one stays lent and held, and no idle time runs for it."""
    gone_bad = node("a", state=LENT, moved_at=NOW - 1000, fenced=True)
    idle: dict[str, float] = {}
    update_idle(idle, [gone_bad], NOW - 500)
    assert idle == {}  # held: its idle time starts once it is unfenced
    assert plan([gone_bad], Demand(), WIDE, NOW, {"a": NOW - 500}).moves == []
    # healed in place (unfenced), still idle: it returns as any lent node does, after return_after
    healed = replace(gone_bad, fenced=False)
    update_idle(idle, [healed], NOW)
    assert plan([healed], Demand(), WIDE, NOW + 10, idle).moves == []
    assert verbs(plan([healed], Demand(), WIDE, NOW + 31, idle)) == [("a", "return")]


@pytest.mark.parametrize(
    "held",
    [
        node("a", state=LENDING, moved_at=NOW - 500, drained=True, reason="autoheal: XID 79 inc-1"),
        node("a", state=LENDING, moved_at=NOW - 500, in_slurm=False),  # lending, slurmd gone already
        busy("a", Job("7", 1), state=LENDING, moved_at=NOW - 500, drained=True, reason=LEND_REASON),
        node("a", state=RET, inference_pods=1),
        node("a", state=RET),
        node("a", drained=True, reason=LEND_REASON),  # training, our drain left over
    ],
    ids=[
        "lending-drained-by-the-fence",
        "lending-not-in-slurm",
        "lending-past-grace",
        "returning-pods",
        "returning-empty",
        "training-our-drain",
    ],
)
def test_no_move_under_way_goes_on_while_the_node_is_fenced(held: PoolNode) -> None:
    fenced = replace(held, fenced=True)
    for demand in (Demand(), Demand(1, 4)):
        assert plan([fenced], demand, WIDE, NOW).moves == [], demand
    # the same node unfenced moves (so the hold is what stops it)
    assert plan([held], Demand(), WIDE, NOW).moves or plan([held], Demand(1, 4), WIDE, NOW).moves


def test_a_fenced_nodes_gpus_are_not_free_so_its_evicted_pods_lend_the_next_node() -> None:
    """The runbook evicted the lent node's inference pod: Pending again. Its 4 GPUs serve no one,
    so the next node is lent; the fenced node is no lent node for max_nodes either."""
    fenced = node("a", state=LENT, moved_at=NOW, fenced=True)
    nodes = [fenced, node("b"), node("c")]
    p = plan(nodes, Demand(1, 4), replace(WIDE, max_nodes=1), NOW)
    assert verbs(p) == [("b", "lend")] and not p.short
    # unfenced (not the runbook's), the same lent node's free GPUs cover the pod: nothing lent
    assert plan([replace(fenced, fenced=False), node("b"), node("c")], Demand(1, 4), WIDE, NOW).moves == []


def test_a_fenced_node_counts_in_neither_side_of_its_pools_limits() -> None:
    """Pool of 3, one fenced: its size for max_percent and min_training is 2."""
    nodes = [node("a", state=LENT, fenced=True), node("b"), node("c")]
    p = plan(nodes, Demand(2, 8), replace(WIDE, max_percent=50, min_training=1), NOW)
    assert verbs(p) == [("b", "lend")] and p.limit.startswith("max_percent 50% of pool h100 (2 nodes)")
    # a training node the runbook fenced is no candidate and no training node either
    nodes = [node("a", fenced=True), node("b"), node("c")]
    p = plan(nodes, Demand(2, 8), replace(WIDE, min_training=1), NOW)
    assert verbs(p) == [("b", "lend")] and p.limit == "min_training 1 of pool h100"


def test_the_replacement_of_a_retired_lent_node_arrives_as_training_and_goes_where_it_is_short() -> None:
    """The retired node leaves with its Node (and label); its replacement is a new Node, no label:
    training. Inference short: the lender lends it; nothing Pending: it stays with training."""
    new = node("a-new")
    assert new.state is T
    assert verbs(plan([node("b", state=LENT, inference_gpus=4), new], Demand(1, 4), WIDE, NOW)) == [
        ("a-new", "lend")
    ]
    assert plan([node("b", state=LENT, inference_gpus=4), new], Demand(), WIDE, NOW).moves == []
