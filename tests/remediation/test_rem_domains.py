"""One incident per failure domain (issue 36, remediation/domains.py): a whole leaf switch's nodes
flapping together is one incident for the switch - one page, no node drained, the budget and the
breaker untouched - while a node with a fault of its own is still drained. The runner's real
intake, policy and round on a real journal; the nodes' topology labels in a FakeKube."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from autoheal.faults import load_fault_catalog
from autoheal.xid import load_catalog
from remediation.domains import JOINED
from remediation.kubeview import FakeKube
from remediation.models import WebhookPayload
from remediation.policy import Policy, breaker_state
from remediation.states import IncidentState
from tests.remediation.remhelp import payload
from tests.remediation.test_rem_degraded import _alert

LEAF = "topology.k8s.aws/network-node-layer-3"
SHIPPED_RULES = str(Path(__file__).resolve().parents[2] / "config" / "rules.yaml")  # routes NodeDegraded
S = IncidentState


@pytest.fixture
def topo(kube: FakeKube) -> FakeKube:
    """gpu-1..6 under leaf nn-aaa, gpu-7..8 under nn-bbb, gpu-9 with no topology label."""
    for i in range(1, 7):
        kube.nodes[f"gpu-{i}"][LEAF] = "nn-aaa"
    for i in (7, 8):
        kube.nodes[f"gpu-{i}"][LEAF] = "nn-bbb"
    return kube


def _deliver(rt: Any, *nodes: str, fault: str = "link_flap") -> None:
    res = rt.intake.record(WebhookPayload.model_validate(payload(*(_alert(n, fault) for n in nodes))))
    assert len(res.created) == len(nodes), res


def _by_node(rt: Any) -> dict[str, Any]:
    return {i.node: i for i in rt.journal.incidents()}


def test_a_whole_switch_flapping_is_one_incident_for_the_switch_not_a_drain_of_the_rack(
    runtime_factory: Any, topo: FakeKube
) -> None:
    rt = runtime_factory(
        rules_file=SHIPPED_RULES, budgets={"max_nodes": 2, "max_pool_percent": 100}, dry_run=True
    )
    _deliver(rt, *(f"gpu-{i}" for i in range(1, 6)))
    time.sleep(0.1)  # the batch window
    rt.worker.tick()
    incs = _by_node(rt)
    states = {n: (i.state, i.tier) for n, i in incs.items()}
    assert set(states.values()) == {(S.NOTIFIED, "notify")}, states  # none admitted, none drained
    [lead] = [i for i in incs.values() if i.reason.startswith("failure domain nn-aaa:")]
    assert "5 nodes with link_flap/nic_errors" in lead.reason and "no node drained" in lead.reason
    for i in incs.values():
        if i.id != lead.id:
            [joined] = [e for e in rt.journal.timeline(i.id) if e.phase == JOINED]
            assert joined.detail == lead.id
    pages = [m for m in rt.notifier.sent if m["event"].startswith("incident.")]
    assert [(m["event"], m["incident"]) for m in pages] == [("incident.notify", lead.id)]  # one page
    assert not breaker_state(rt.journal).open  # the budget was never spent: nothing to trip

    # the switch flaps on: its sixth node, alerting later, joins the same incident
    _deliver(rt, "gpu-6", fault="nic_errors")
    rt.worker.tick()
    late = max(rt.journal.incidents(), key=lambda i: i.opened_at)
    assert (late.node, late.state) == ("gpu-6", S.NOTIFIED)
    assert [e.detail for e in rt.journal.timeline(late.id) if e.phase == JOINED] == [lead.id]
    # and counts toward no node's cap or escalation (the notify tier)
    assert rt.journal.count_node_incidents("gpu-6", time.time() - 60) == 0


def test_a_node_of_a_domain_waits_for_its_peers_then_is_its_own_fault(
    config_factory: Any, runtime_factory: Any, topo: FakeKube
) -> None:
    rt = runtime_factory(with_worker=False, rules_file=SHIPPED_RULES)
    _deliver(rt, "gpu-7", "gpu-9")  # gpu-7 under nn-bbb (one node), gpu-9 without a domain
    cfg = config_factory(failure_domains={"hold_seconds": 5})
    policy = Policy(cfg, rt.journal, topo, load_catalog(), load_fault_catalog())
    pending = rt.journal.incidents([S.PENDING])
    now = max(i.opened_at for i in pending)
    decisions, tripped = policy.decide(pending, now)
    acts = {pending_node(rt, d.incident_id): (d.action, d.reason) for d in decisions}
    assert acts["gpu-9"][0] == "admit"  # no domain: drained at once, as before
    assert acts["gpu-7"][0] == "wait" and "nn-bbb" in acts["gpu-7"][1]
    decisions, _ = policy.decide(pending, now + 6)  # held long enough, alone: its own fault
    assert {pending_node(rt, d.incident_id): d.action for d in decisions} == {
        "gpu-7": "admit",
        "gpu-9": "admit",
    }
    assert tripped is None


def test_two_nodes_below_the_threshold_are_each_their_own_and_other_faults_are_never_grouped(
    config_factory: Any, runtime_factory: Any, topo: FakeKube
) -> None:
    rt = runtime_factory(with_worker=False, rules_file=SHIPPED_RULES)
    _deliver(rt, "gpu-7", "gpu-8")  # two of nn-bbb: below min_nodes (3)
    _deliver(rt, "gpu-1", "gpu-2", "gpu-3", fault="gpu_throttle")  # a GPU's own fault, shared leaf
    cfg = config_factory(
        failure_domains={"hold_seconds": 0}, budgets={"max_nodes": 10, "max_pool_percent": 100}
    )
    policy = Policy(cfg, rt.journal, topo, load_catalog(), load_fault_catalog())
    pending = rt.journal.incidents([S.PENDING])
    decisions, _ = policy.decide(pending, time.time())
    assert [d.action for d in decisions] == ["admit"] * 5


def test_without_a_label_the_static_map_names_the_domain(
    config_factory: Any, runtime_factory: Any, kube: FakeKube
) -> None:
    rt = runtime_factory(with_worker=False, rules_file=SHIPPED_RULES)
    _deliver(rt, "gpu-11", "gpu-12", "gpu-13")
    cfg = config_factory(
        failure_domains={"label": "", "nodes": {"gpu-11": "rack-4", "gpu-12": "rack-4", "gpu-13": "rack-4"}}
    )
    policy = Policy(cfg, rt.journal, kube, load_catalog(), load_fault_catalog())
    decisions, _ = policy.decide(rt.journal.incidents([S.PENDING]), time.time())
    assert sorted(d.action for d in decisions) == ["join", "join", "notify"]


def test_bad_domain_settings_are_refused_naming_the_field(config_factory: Any) -> None:
    from autoheal.errors import ConfigError

    with pytest.raises(ConfigError, match=r"failure_domains\.min_nodes"):
        config_factory(failure_domains={"min_nodes": 1})
    with pytest.raises(ConfigError, match=r"failure_domains\.nodes"):
        config_factory(failure_domains={"nodes": {"gpu 1; reboot": "rack-1"}})
    with pytest.raises(ConfigError, match=r"failure_domains\.faults"):
        config_factory(failure_domains={"faults": ["straggler"]})


def pending_node(rt: Any, incident_id: str) -> str:
    return str(rt.journal.require_incident(incident_id).node)
