"""Policy decisions: opt-out, budgets, the breaker, the per-node cap, escalation, dry run."""

from __future__ import annotations

import time

import pytest

from autoheal.xid import load_catalog
from remediation.kubeview import FakeKube
from remediation.manual import reset_breaker
from remediation.policy import BREAKER_KEY, Policy, breaker_state, budget_limit
from remediation.states import IncidentState


@pytest.fixture
def journal(journal_target):
    """The policy's decisions read the journal: on each engine (SQLite, PostgreSQL)."""
    return journal_target.open()


def _open(journal, node, xid=79, tier="replace", rule_dry_run=False, opened=None):
    with journal.transaction(opened) as tx:
        return tx.create_incident(
            node=node,
            gpu=0,
            xid=xid,
            fault_class="gpu-fatal",
            tier=tier,
            fingerprint="ab",
            rule="r",
            playbook="gpu_fatal_xid.yml",
            extra_vars={},
            rule_dry_run=rule_dry_run,
        )


def _decide(cfg, journal, kube):
    policy = Policy(cfg, journal, kube, load_catalog())
    return policy.decide(journal.incidents(["pending"]), time.time())


@pytest.mark.parametrize(
    ("n", "pct", "pool", "expected"),
    [
        (5, 10, 100, 5),
        (5, 10, 20, 2),
        (5, 10, 4, 1),
        (5, 100, None, 5),
        (1, 50, 100, 1),
        (10, 1, 1, 1),
    ],
)
def test_budget_is_min_of_nodes_and_pool_percent_never_below_one(n, pct, pool, expected):
    assert budget_limit(n, pct, pool) == expected


def test_node_label_opt_out_admits_with_opt_out_set(config_factory, journal):
    kube = FakeKube({"gpu-1": {"autoheal.io/opt-out": "true"}, "gpu-2": {}})
    a, b = _open(journal, "gpu-1"), _open(journal, "gpu-2")
    decisions, tripped = _decide(config_factory(), journal, kube)
    by = {d.incident_id: d for d in decisions}
    assert tripped is None
    assert by[a].action == "admit" and by[a].opt_out and "node label" in by[a].reason
    assert by[b].action == "admit" and not by[b].opt_out


def test_opt_out_label_on_a_pod_of_the_node_counts(config_factory, journal):
    kube = FakeKube(
        {"gpu-1": {}},
        pods=[("gpu-1", {"autoheal.io/opt-out": "yes"}), ("gpu-2", {"autoheal.io/opt-out": "false"})],
    )
    a, b = _open(journal, "gpu-1"), _open(journal, "gpu-2")
    by = {d.incident_id: d for d in _decide(config_factory(), journal, kube)[0]}
    assert by[a].opt_out and "pod" in by[a].reason
    assert not by[b].opt_out


def test_storm_beyond_node_budget_trips_breaker_and_admits_only_the_budget(config_factory, journal):
    cfg = config_factory(budgets={"max_nodes": 3, "max_pool_percent": 100})
    ids = [_open(journal, f"gpu-{i}") for i in range(10)]
    decisions, tripped = _decide(cfg, journal, FakeKube())
    admitted = [d for d in decisions if d.action == "admit"]
    assert [d.incident_id for d in admitted] == ids[:3]
    assert tripped and "budget of 3" in tripped
    assert all(d.action == "hold" for d in decisions[3:])


def test_pool_percent_budget_limits_one_pool(config_factory, journal):
    nodes = {f"a-{i}": {"autoheal.io/pool": "a"} for i in range(10)}
    nodes.update({f"b-{i}": {"autoheal.io/pool": "b"} for i in range(100)})
    cfg = config_factory(budgets={"max_nodes": 50, "max_pool_percent": 20})
    for n in ("a-0", "a-1", "a-2", "b-0"):
        _open(journal, n)
    decisions, tripped = _decide(cfg, journal, FakeKube(nodes))
    assert [d.action for d in decisions] == ["admit", "admit", "hold", "hold"]
    assert "pool 'a'" in tripped


def test_open_breaker_holds_everything_until_a_human_resets_it(config_factory, journal):
    with journal.transaction() as tx:
        tx.set_setting(BREAKER_KEY, {"open": True, "reason": "storm", "tripped_at": 1.0})
    _open(journal, "gpu-1")
    decisions, _ = _decide(config_factory(), journal, FakeKube())
    assert [d.action for d in decisions] == ["hold"]
    assert breaker_state(journal).open
    reset_breaker(journal, "switch fixed")
    assert not breaker_state(journal).open


def test_node_over_its_incident_cap_is_quarantined(config_factory, journal):
    cfg = config_factory(node_cap={"max_incidents": 2, "window_seconds": 3600})
    for _ in range(2):
        iid = _open(journal, "gpu-1")
        with journal.transaction() as tx:
            for state in (IncidentState.ADMITTED, IncidentState.RUNNING, IncidentState.COMPLETED):
                tx.transition(iid, state, "done")
    _open(journal, "gpu-1")
    [d] = _decide(cfg, journal, FakeKube())[0]
    assert d.action == "quarantine" and d.opt_out and "quarantine" in d.reason


def test_repeated_reset_faults_climb_one_rung_to_reboot(config_factory, journal):
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    repeats = load_catalog().escalation.repeats
    for _ in range(repeats - 1):
        iid = _open(journal, "gpu-1", xid=48, tier="reset")
        with journal.transaction() as tx:
            for state in (IncidentState.ADMITTED, IncidentState.RUNNING, IncidentState.COMPLETED):
                tx.transition(iid, state, "done")
    _open(journal, "gpu-1", xid=48, tier="reset")
    [d] = _decide(cfg, journal, FakeKube())[0]
    assert d.action == "admit" and d.tier == "reboot" and "escalated" in d.reason


def test_first_reset_fault_stays_reset(config_factory, journal):
    _open(journal, "gpu-1", xid=48, tier="reset")
    [d] = _decide(config_factory(), journal, FakeKube())[0]
    assert d.tier == "reset"


def test_notify_tier_runs_nothing(config_factory, journal):
    _open(journal, "gpu-1", xid=13, tier="notify")
    [d] = _decide(config_factory(), journal, FakeKube())[0]
    assert d.action == "notify"


def test_dry_run_comes_from_runner_or_rule(config_factory, journal):
    a = _open(journal, "gpu-1", rule_dry_run=True)
    b = _open(journal, "gpu-2")
    by = {d.incident_id: d for d in _decide(config_factory(), journal, FakeKube())[0]}
    assert by[a].dry_run and not by[b].dry_run
    by = {d.incident_id: d for d in _decide(config_factory(dry_run=True), journal, FakeKube())[0]}
    assert by[a].dry_run and by[b].dry_run


def test_second_fault_on_a_node_in_remediation_waits(config_factory, journal):
    a = _open(journal, "gpu-1")
    with journal.transaction() as tx:
        tx.transition(a, IncidentState.ADMITTED, "admitted")
        tx.transition(a, IncidentState.RUNNING, "admitted")
        b = tx.create_incident(
            node="gpu-1",
            gpu=0,
            xid=79,
            fault_class="other",
            tier="replace",
            fingerprint="cd",
            rule="r",
            playbook="gpu_fatal_xid.yml",
            extra_vars={},
            rule_dry_run=False,
        )
    [d] = _decide(config_factory(), journal, FakeKube())[0]
    assert d.incident_id == b and d.action == "wait"
