"""Degraded nodes in the runner (issue 36): NodeDegraded alerts are checked against the fault
catalogue and become one drain-tier incident per node; the policy's escalation, breaker and budgets
hold for the new rung; the play contract takes it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from autoheal.faults import load_fault_catalog
from autoheal.xid import Tier, load_catalog
from remediation.executor import PlayVars
from remediation.incidents import Incident, Intake, Rejected, normalise
from remediation.kubeview import FakeKube
from remediation.models import Alert, WebhookPayload
from remediation.policy import Policy
from remediation.rules import load_rules
from remediation.states import IncidentState
from tests.remediation.remhelp import payload

REPO = Path(__file__).resolve().parents[2]
RULES = load_rules(REPO / "config" / "rules.yaml")


@pytest.fixture
def journal(journal_target: Any) -> Any:
    return journal_target.open()


def _alert(node: str = "gpu-2", fault: str = "link_flap", **labels: str) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {
            "alertname": "NodeDegraded",
            "Hostname": node,
            "fault": fault,
            "tier": "drain",
            "severity": "warning",
            "source": "watcher",
            "device": "mlx5_0/1",
            **labels,
        },
        "annotations": {"summary": f"{fault} on {node}"},
        "startsAt": "2026-12-03T20:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": format(abs(hash((node, fault, tuple(labels.items())))) % (1 << 60), "x"),
    }


def _normalise(raw: dict[str, Any]) -> Incident | Rejected:
    alert = Alert.model_validate(raw)
    rule = RULES.route(alert.labels)
    assert rule is not None and rule.playbook == "gpu_degraded.yml"
    return normalise(alert, rule, load_catalog(), load_fault_catalog())


def test_a_degraded_alert_is_a_drain_incident_of_the_node_naming_its_class() -> None:
    inc = _normalise(_alert(fault="pcie_downtrained"))
    assert isinstance(inc, Incident)
    assert (inc.node, inc.xid, inc.gpu, inc.tier) == ("gpu-2", 0, None, Tier.DRAIN)
    assert inc.fault == "pcie_downtrained" and inc.fault_class == "degraded"
    assert '"fault": "pcie_downtrained"' in inc.facts()


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"fault": "link_flap; scontrol delete"}, "not a fault class"),
        ({"fault": "LINK_FLAP"}, "not a fault class"),
        ({"fault": "{{ lookup('pipe', 'id') }}"}, "not a fault class"),
        ({"fault": ""}, "not a fault class"),
        ({"Hostname": "gpu-2;reboot"}, "not a valid node name"),
    ],
)
def test_hostile_labels_are_refused(labels: dict[str, str], why: str) -> None:
    res = _normalise(_alert(**labels))
    assert isinstance(res, Rejected) and why in res.reason


def test_the_rung_is_the_catalogues_not_the_alerts() -> None:
    inc = _normalise(_alert(tier="replace", xid="79"))
    assert isinstance(inc, Incident) and inc.tier is Tier.DRAIN


def test_two_faults_of_one_node_are_one_incident_and_a_missing_fault_label_is_refused(journal: Any) -> None:
    intake = Intake(journal, RULES, load_catalog(), 900, load_fault_catalog())
    res = intake.record(WebhookPayload.model_validate(payload(_alert(), _alert(fault="nic_errors"))))
    assert len(res.created) == 1 and res.rejected == 0  # the second joined the first
    [inc] = journal.incidents(["pending"])
    assert (inc.tier, inc.playbook, inc.xid) == ("drain", "gpu_degraded.yml", 0)
    bad = _alert()
    del bad["labels"]["fault"]
    with pytest.raises(Exception, match="fault"):
        intake.record(WebhookPayload.model_validate(payload(bad)))


def _open(journal: Any, node: str, tier: str = "drain") -> str:
    with journal.transaction() as tx:
        iid: str = tx.create_incident(
            node=node,
            gpu=None,
            xid=0,
            fault_class="degraded",
            tier=tier,
            fingerprint=node,
            rule="Node degraded",
            playbook="gpu_degraded.yml",
            extra_vars={},
            rule_dry_run=False,
        )
        return iid


def _decide(cfg: Any, journal: Any) -> tuple[list[Any], str | None]:
    return Policy(cfg, journal, FakeKube(), load_catalog(), load_fault_catalog()).decide(
        journal.incidents(["pending"]), time.time()
    )


def test_a_drain_is_admitted_on_its_rung(config_factory: Any, journal: Any) -> None:
    iid = _open(journal, "gpu-1")
    [d], tripped = _decide(config_factory(), journal)
    assert (d.incident_id, d.action, d.tier, tripped) == (iid, "admit", "drain", None)


def test_a_node_that_keeps_degrading_climbs_to_quarantine(config_factory: Any, journal: Any) -> None:
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    for _ in range(load_fault_catalog().escalation.repeats - 1):
        iid = _open(journal, "gpu-1")
        with journal.transaction() as tx:
            for state in (IncidentState.ADMITTED, IncidentState.RUNNING, IncidentState.COMPLETED):
                tx.transition(iid, state, "done")
    _open(journal, "gpu-1")
    [d], _ = _decide(cfg, journal)
    assert d.action == "admit" and d.tier == "quarantine" and "escalated to quarantine" in d.reason


def test_a_whole_switch_flapping_trips_the_breaker_instead_of_draining_the_rack(
    config_factory: Any, journal: Any
) -> None:
    cfg = config_factory(budgets={"max_nodes": 2, "max_pool_percent": 100})
    ids = [_open(journal, f"gpu-{i}") for i in range(8)]
    decisions, tripped = _decide(cfg, journal)
    assert [d.incident_id for d in decisions if d.action == "admit"] == ids[:2]
    assert all(d.action == "hold" for d in decisions[2:])
    assert tripped and "storm" in tripped


def test_the_play_contract_takes_the_drain_rung(tmp_path: Path) -> None:
    pv = PlayVars(("gpu-1",), ("inc-0123456789ab",), 0, None, "drain", False, False, 0, tmp_path / "e.jsonl")
    assert pv.extravars()["autoheal_tier"] == "drain"
