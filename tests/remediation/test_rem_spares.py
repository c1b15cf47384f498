"""The spare keeper's and the dead-node cleanup's decision tables (issue 32, Deliver 4 and 5), as
pure functions: no cluster. The loops against a real API server and real Slurm are tested in
tests/k8s_runner/test_fleet_loops.py and tests/nodes/test_dead_node_cleanup.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import JOINING_REASON, SPARE_REASON
from remediation.cordon_sync import KubeNode, SlurmNode, parse_sinfo
from remediation.dead_nodes import decide, implausible, plan
from remediation.errors import RunnerConfigError
from remediation.notify import SpareShortage
from remediation.spares import PoolDecl, parse_pool, plan_pool

POOL = PoolDecl("h100", spares=1)
SPARE_TAINT = ("autoheal.io/spare", "true", "NoSchedule")
OPT_OUT = "autoheal.io/opt-out"


def node(name: str, state: str | None = None, created: str = "2026-01-01T00:00:00Z", **kw: Any) -> KubeNode:
    labels = {"autoheal.io/pool": "h100", **kw.pop("labels", {})}
    if state is not None:
        labels["autoheal.io/state"] = state
    return KubeNode(name, labels=labels, created=created, **kw)


def spare(name: str) -> KubeNode:
    return node(name, "spare", labels={"autoheal.io/spare": "true"}, taints=(SPARE_TAINT,))


def idle(name: str, **kw: Any) -> SlurmNode:
    return SlurmNode(name, drained=False, reason="", dynamic=True, **kw)


def verbs(actions: list[Any]) -> list[tuple[str, str, str, bool]]:
    return [(a.node, a.verb, a.slurm, a.kube) for a in actions]


def test_a_new_node_becomes_a_spare_while_the_pool_is_short_and_active_after() -> None:
    nodes = [
        node("a", "active"),
        node("n1", created="2026-01-02T00:00:00Z"),
        node("n2", created="2026-01-03T00:00:00Z"),
    ]
    joining = {n: SlurmNode(n, True, JOINING_REASON, dynamic=True) for n in ("n1", "n2")}
    actions, count = plan_pool(POOL, nodes, joining, OPT_OUT)
    # the older new node is the spare (drained with exactly the spare reason), the other active
    # and resumed from the bridge's joining drain
    assert verbs(actions) == [("n1", "spare", "drain", True), ("n2", "active", "resume", True)]
    assert count == 1


def test_a_promoted_spares_replacement_restores_the_count() -> None:
    # the spare s was promoted (state active, no label); r is the backend's replacement
    nodes = [node("a", "active"), node("s", "active"), node("r")]
    actions, count = plan_pool(POOL, nodes, {"r": idle("r")}, OPT_OUT)
    assert verbs(actions) == [("r", "spare", "drain", True)]
    assert count == 1


def test_the_second_pass_changes_nothing() -> None:
    nodes = [node("a", "active"), spare("s")]
    assert plan_pool(POOL, nodes, {"s": SlurmNode("s", True, SPARE_REASON, dynamic=True)}, OPT_OUT) == ([], 1)


@pytest.mark.parametrize(
    ("k", "why"),
    [
        (node("q", "quarantined"), "quarantined: the runbook's"),
        (node("o", labels={OPT_OUT: "true"}), "opted out"),
        (node("u", ready=False), "not Ready yet"),
    ],
)
def test_nodes_the_keeper_never_touches(k: KubeNode, why: str) -> None:
    assert plan_pool(POOL, [k], {k.name: idle(k.name)}, OPT_OUT) == ([], 0), why


def test_a_pool_with_remediation_off_is_left_alone_but_counted() -> None:
    off = PoolDecl("h100", spares=2, remediation=False)
    assert plan_pool(off, [spare("s"), node("n")], {}, OPT_OUT) == ([], 1)


def test_busy_or_declared_active_nodes_are_never_made_spares() -> None:
    pool = PoolDecl("h100", spares=2, active_names=frozenset({"gpu-1"}))
    nodes = [node("gpu-1"), node("busy")]
    actions, count = plan_pool(pool, nodes, {"busy": idle("busy", busy=True)}, OPT_OUT)
    assert verbs(actions) == [("busy", "active", "", True), ("gpu-1", "active", "", True)]
    assert count == 0


def test_a_node_already_labelled_spare_by_a_pool_controller_is_taken_first() -> None:
    lab_spare = node("z", labels={"autoheal.io/spare": "true"}, taints=(SPARE_TAINT,))
    actions, _ = plan_pool(POOL, [node("a"), lab_spare], {}, OPT_OUT)
    assert verbs(actions) == [("z", "spare", "", True), ("a", "active", "", True)]


def test_spare_repair_puts_marks_back_and_never_undoes_a_promotion_or_an_admin() -> None:
    bare = node("s", "spare")  # someone removed label and taint
    assert verbs(plan_pool(POOL, [bare], {}, OPT_OUT)[0]) == [("s", "spare", "", True)]
    # Slurm shows the spare idle (its slurmd registered after the label): drained again
    assert verbs(plan_pool(POOL, [spare("s")], {"s": idle("s")}, OPT_OUT)[0]) == [
        ("s", "spare", "drain", False)
    ]
    # slurm_spares marked it for a promotion and resumed it: hands off
    promoting = idle("s", comment="autoheal: replaces gpu-1 inc-1")
    assert plan_pool(POOL, [spare("s")], {"s": promoting}, OPT_OUT)[0] == []
    # an admin's drain stays
    admin = SlurmNode("s", True, "admin: bios", dynamic=True)
    assert plan_pool(POOL, [spare("s")], {"s": admin}, OPT_OUT)[0] == []


def test_pool_json_of_the_component_is_read_and_bad_input_names_the_field() -> None:
    doc = {
        "name": "h100",
        "spares": 2,
        "remediation": {"enabled": False, "waiver": "x"},
        "spare": {
            "label": {"key": "autoheal.io/spare", "value": "true"},
            "taint": dict(zip(("key", "value", "effect"), SPARE_TAINT, strict=True)),
        },
        "nodeNames": {"active": ["gpu-1"], "spares": ["gpu-2"], "future": []},
    }
    pool = parse_pool("cm", json.dumps(doc))
    assert (pool.name, pool.spares, pool.remediation, pool.active_names) == (
        "h100",
        2,
        False,
        frozenset({"gpu-1"}),
    )
    with pytest.raises(RunnerConfigError, match="spares: a count"):
        parse_pool("cm", json.dumps({"name": "h100", "spares": -1}))
    with pytest.raises(RunnerConfigError, match="not JSON"):
        parse_pool("cm", "{")


def test_one_notification_when_a_pool_runs_dry_not_repeated_until_it_recovers() -> None:
    sent: list[dict[str, Any]] = []
    shortage = SpareShortage(lambda event, **f: sent.append({"event": event, **f}))
    for spares in (1, 0, 0, 0, 1, 0):
        shortage.level("h100", spares, 1)
    shortage.level("cpu", 0, 0)  # declares none: nothing to run out of
    assert [(s["event"], s["pool"]) for s in sent] == [("pool.spares_exhausted", "h100")] * 2


# --- dead nodes ---------------------------------------------------------------------------------

DEAD = SlurmNode("d", True, "Not responding", dynamic=True)


@pytest.mark.parametrize(
    ("s", "present", "gone_for", "want"),
    [
        (DEAD, True, None, None),  # the Node is there
        (SlurmNode("d", True, "x", dynamic=False), False, 999.0, None),  # static: slurm.conf's
        (DEAD, False, 5.0, "wait"),  # within the grace: maybe re-registering
        (SlurmNode("d", True, "x", dynamic=True, busy=True), False, 999.0, "wait"),  # jobs on it
        (DEAD, False, 30.0, "delete"),
        (idle("d"), False, 60.0, "delete"),  # gone from Kubernetes, idle in Slurm: a dead record too
    ],
)
def test_dead_node_decision_table(
    s: SlurmNode, present: bool, gone_for: float | None, want: str | None
) -> None:
    v = decide(s, present, gone_for, grace=30.0)
    assert (None if v is None else v.verb) == want


def test_dead_node_grace_is_timed_from_the_first_pass_that_missed_the_node() -> None:
    missing: dict[str, float] = {}
    slurm = {"d": DEAD, "alive": idle("alive")}
    assert [v.verb for v in plan(slurm, ["alive"], missing, now=100.0, grace=30.0)] == ["wait"]
    assert [v.verb for v in plan(slurm, ["alive"], missing, now=131.0, grace=30.0)] == ["delete"]
    # the Node came back (re-registered): the timer starts over
    assert plan(slurm, ["alive", "d"], missing, now=140.0, grace=30.0) == [] and missing == {}


def test_slurm_json_gives_dynamic_busy_and_comment() -> None:
    new = {
        "nodes": [
            {"name": "a", "state": ["IDLE", "DYNAMIC_NORM"], "comment": "c", "alloc_cpus": 0},
            {"name": "b", "state": ["MIXED", "DYNAMIC_NORM"], "alloc_cpus": 4},
            {"name": "c", "state": ["DOWN", "COMPLETING"]},
        ]
    }
    got = parse_sinfo(json.dumps(new))
    assert (got["a"].dynamic, got["a"].busy, got["a"].comment) == (True, False, "c")
    assert got["b"].busy and got["c"].busy and not got["c"].dynamic


def test_the_fleet_loops_are_built_off_by_default_and_act_only_while_leading(tmp_path: Path) -> None:
    from remediation.cluster_side import ClusterSide
    from tests.remediation.remhelp import make_config

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    off = ClusterSide.from_config(make_config(tmp_path, kubeconfig=str(kubeconfig)))
    assert off.keeper is None and off.reaper is None
    leading = [False]
    cfg = make_config(
        tmp_path,
        kubeconfig=str(kubeconfig),
        spare_keeper={"enabled": True},
        dead_nodes={"enabled": True, "grace_seconds": 45},
    )
    side = ClusterSide.from_config(cfg, leading=lambda: leading[0])
    assert side.keeper is not None and side.reaper is not None and side.reaper.grace == 45
    assert not side.keeper.leading() and not side.reaper.leading()
    leading[0] = True
    assert side.keeper.leading() and side.reaper.leading()
    assert side.keeper.journal.path == cfg.state_dir / "spare-keeper.jsonl"


def test_a_node_list_missing_most_dynamic_nodes_deletes_nothing() -> None:
    slurm = {f"n{i}": idle(f"n{i}") for i in range(6)}
    assert implausible(slurm, ["n0", "n1", "n2", "n3"]) is None  # two gone: believable
    assert "4 of 6" in str(implausible(slurm, ["n0", "n1"]))  # most of the fleet at once: not
    assert (
        implausible({**slurm, "static": SlurmNode("static", False, "")}, [f"n{i}" for i in range(6)]) is None
    )
