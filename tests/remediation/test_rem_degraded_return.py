"""A degraded node back to service once its job ended (issue 36): the runner's degraded-return loop
(remediation/degraded_return.py) on a real journal and a scripted Slurm. The play it starts
(playbooks/degraded_return.yml) runs on the lab's real Slurm in tests/runbook/test_degraded_play.py
and end to end in tests/watcher/test_lab_link_flap.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoheal.errors import ConfigError
from remediation.cordon_sync import SlurmNode
from remediation.degraded_return import (
    QUEUED,
    RETURN_PLAYBOOK,
    RETURN_SOURCE,
    DegradedReturn,
    Verdict,
    decide,
    make_return_loop,
)
from remediation.journal import IncidentRecord, Journal
from remediation.states import IncidentState
from tests.remediation.remhelp import make_config

S = IncidentState
REASON = "autoheal: degraded drain "


class FakeSlurm:
    def __init__(self) -> None:
        self.table: dict[str, SlurmNode] = {}
        self.reads = 0

    def nodes(self) -> dict[str, SlurmNode]:
        self.reads += 1
        return dict(self.table)

    def set(self, name: str, *, drained: bool = True, reason: str = "", busy: bool = False) -> None:
        self.table[name] = SlurmNode(name, drained, reason, busy=busy)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "j.sqlite")
    yield j
    j.close()


def drain_incident(
    journal: Journal,
    node: str,
    fault: str = "link_flap",
    *,
    tier: str = "drain",
    dry_run: bool = False,
    end: IncidentState = S.COMPLETED,
) -> str:
    """A degraded drain incident as the runner leaves it: admitted, run, closed."""
    with journal.transaction() as tx:
        iid = tx.create_incident(
            node=node,
            gpu=None,
            xid=0,
            fault_class="degraded",
            tier=tier,
            fingerprint=f"fp-{node}-{fault}",
            rule="Node degraded",
            playbook="gpu_degraded.yml",
            extra_vars={},
            rule_dry_run=dry_run,
        )
        tx.timeline(iid, "alert_facts", "ok", source="alertmanager", detail=json.dumps({"fault": fault}))
        tx.mark(iid, dry_run=dry_run)
        tx.transition(iid, S.ADMITTED, "admitted")
        tx.transition(iid, S.RUNNING, "running")
        tx.transition(iid, end, "done")
    return iid


def loop(
    journal: Journal, slurm: FakeSlurm, woken: list[int] | None = None, wait_quiet: bool = False
) -> DegradedReturn:
    return DegradedReturn(
        journal,
        slurm,
        interval=1.0,
        lookback=3600.0,
        leading=lambda: True,
        wake=(lambda: woken.append(1)) if woken is not None else (lambda: None),
        wait_quiet=wait_quiet,
    )


def returns(journal: Journal) -> list[IncidentRecord]:
    return [i for i in journal.incidents([S.ADMITTED]) if i.source == RETURN_SOURCE]


def _inc(node: str = "gpu-2") -> IncidentRecord:
    return IncidentRecord(
        id="inc-000000000001",
        node=node,
        gpu=None,
        xid=0,
        fault_class="degraded",
        tier="drain",
        fingerprint="fp",
        rule="r",
        playbook="gpu_degraded.yml",
        extra_vars={},
        rule_dry_run=False,
        state=S.COMPLETED,
        reason="admitted",
        opt_out=False,
        dry_run=False,
        alert_count=1,
        resolved_alerts=0,
        opened_at=0.0,
        updated_at=0.0,
        closed_at=1.0,
        run_id=None,
        cancel_requested=False,
        source="alertmanager",
    )


@pytest.mark.parametrize(
    ("slurm", "open_nodes", "verb", "why"),
    [
        (None, (), "drop", "gone from Slurm"),
        (SlurmNode("gpu-2", False, ""), (), "drop", "back in service"),
        (SlurmNode("gpu-2", True, "admin: bad cable"), (), "drop", "not autoheal's degraded drain"),
        (SlurmNode("gpu-2", True, "autoheal: degraded quarantine inc-1"), (), "drop", "not autoheal's"),
        (SlurmNode("gpu-2", True, "autoheal: XID 79 gpu3 inc-1"), (), "drop", "not autoheal's"),
        (SlurmNode("gpu-2", True, REASON + "inc-1", busy=True), (), "wait", "jobs still running"),
        (SlurmNode("gpu-2", True, REASON + "inc-1"), ("gpu-2",), "wait", "another incident"),
        (SlurmNode("gpu-2", True, REASON + "inc-1"), ("gpu-9",), "queue", "idle"),
    ],
)
def test_the_verdict_of_each_slurm_state(
    slurm: SlurmNode | None, open_nodes: tuple[str, ...], verb: str, why: str
) -> None:
    v = decide(_inc(), slurm, frozenset(open_nodes))
    assert (v.node, v.verb) == ("gpu-2", verb) and why in v.why, v


def test_a_drained_node_waits_for_its_job_then_is_handed_to_validation_once(journal: Journal) -> None:
    drain = drain_incident(journal, "gpu-2", "row_remap_pending")
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + drain, busy=True)
    woken: list[int] = []
    lp = loop(journal, slurm, woken)

    assert lp.reconcile() == [Verdict(drain, "gpu-2", "wait", "jobs still running on it")]
    assert returns(journal) == [] and woken == []

    slurm.set("gpu-2", reason=REASON + drain)  # the job ended: idle, still drained
    [v] = lp.reconcile()
    assert v.verb == "queue"
    [ret] = returns(journal)
    assert (ret.node, ret.playbook, ret.tier, ret.state) == ("gpu-2", RETURN_PLAYBOOK, "drain", S.ADMITTED)
    assert ret.extra_vars == {"autoheal_fault": "row_remap_pending"}  # the play resets the GPUs first
    assert woken == [1]
    queued = [e for e in journal.timeline(drain) if e.phase == QUEUED]
    assert [(e.status, e.detail.split(":")[0]) for e in queued] == [("ok", ret.id)]

    # the next pass, and a new leader's first pass, queue nothing more and read no Slurm
    reads = slurm.reads
    assert lp.reconcile() == [] and loop(journal, slurm).reconcile() == []
    assert len(returns(journal)) == 1 and slurm.reads == reads


def test_a_validation_counts_toward_no_cap_or_escalation(journal: Journal) -> None:
    import time

    drain = drain_incident(journal, "gpu-2")
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + drain)
    loop(journal, slurm).reconcile()
    assert len(returns(journal)) == 1
    assert journal.count_node_incidents("gpu-2", time.time() - 60) == 1  # the drain only


def test_nodes_taken_over_or_gone_are_left_alone_and_said_so(journal: Journal) -> None:
    resumed = drain_incident(journal, "gpu-1")
    admin = drain_incident(journal, "gpu-3")
    gone = drain_incident(journal, "gpu-4")
    slurm = FakeSlurm()
    slurm.set("gpu-1", drained=False)
    slurm.set("gpu-3", reason="bad cable, ticket 123")
    lp = loop(journal, slurm)
    assert {v.node: v.verb for v in lp.reconcile()} == {"gpu-1": "drop", "gpu-3": "drop", "gpu-4": "drop"}
    assert returns(journal) == []
    for iid in (resumed, admin, gone):
        [e] = [e for e in journal.timeline(iid) if e.phase == QUEUED]
        assert e.status == "skipped" and e.detail
    slurm.set("gpu-3", reason=REASON + admin)  # decided once: a later state changes nothing
    assert loop(journal, slurm).reconcile() == []


def test_only_the_newest_drain_of_a_node_is_validated(journal: Journal) -> None:
    old = drain_incident(journal, "gpu-2")
    new = drain_incident(journal, "gpu-2", "nic_errors")
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + new)
    verdicts = {v.incident: v for v in loop(journal, slurm).reconcile()}
    assert verdicts[old].verb == "drop" and new in verdicts[old].why
    assert verdicts[new].verb == "queue"
    [ret] = returns(journal)
    assert ret.extra_vars == {"autoheal_fault": "nic_errors"}


@pytest.mark.parametrize(
    ("tier", "dry_run", "end"),
    [("drain", True, S.COMPLETED), ("quarantine", False, S.COMPLETED), ("drain", False, S.FAILED)],
)
def test_dry_runs_quarantines_and_failed_drains_are_not_returned(
    journal: Journal, tier: str, dry_run: bool, end: IncidentState
) -> None:
    drain = drain_incident(journal, "gpu-2", tier=tier, dry_run=dry_run, end=end)
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + drain)
    assert loop(journal, slurm).reconcile() == []
    assert returns(journal) == [] and slurm.reads == 0


def test_the_return_is_copied_onto_the_drain_incident(journal: Journal) -> None:
    """So a fault that begins after the return opens a new incident (remediation/incidents.py)."""
    drain = drain_incident(journal, "gpu-2")
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + drain)
    lp = loop(journal, slurm)
    lp.reconcile()
    [ret] = returns(journal)
    with journal.transaction() as tx:
        tx.transition(ret.id, S.RUNNING, "running")
        tx.timeline(ret.id, "validated", "ok", source="play", detail="lab")
        tx.timeline(ret.id, "returned", "ok", source="play", ts=tx.now - 0.5, detail="active")
        tx.transition(ret.id, S.COMPLETED, "admitted")
        at = tx.returned_at(ret.id)
        assert tx.returned_at(drain) is None
    lp.reconcile()
    with journal.transaction() as tx:
        assert tx.returned_at(drain) == at


def test_an_idle_node_whose_link_still_flaps_waits_until_its_alert_resolved(journal: Journal) -> None:
    """wait_quiet (production's default): a link flap's alert holds for the fault's window after
    the last flap; the node is validated once it resolved, not while the link may still flap."""
    drain = drain_incident(journal, "gpu-2", "link_flap")
    remap = drain_incident(journal, "gpu-3", "row_remap_pending")
    slurm = FakeSlurm()
    slurm.set("gpu-2", reason=REASON + drain)
    slurm.set("gpu-3", reason=REASON + remap)
    lp = loop(journal, slurm, wait_quiet=True)
    verdicts = {v.node: v for v in lp.reconcile()}
    assert verdicts["gpu-2"].verb == "wait" and "alert still fires" in verdicts["gpu-2"].why
    assert verdicts["gpu-3"].verb == "queue"  # a pending remap clears only at the reset: no wait
    with journal.transaction() as tx:  # Alertmanager's resolved notification, as the intake records it
        tx.timeline(drain, "alert_resolved", "ok", source="alertmanager")
    [v] = lp.reconcile()
    assert (v.node, v.verb) == ("gpu-2", "queue")
    assert loop(journal, FakeSlurm()).wait_quiet is False  # the lab's setting: no wait


def test_the_loop_is_on_by_default_and_its_settings_are_checked(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    assert cfg.degraded_return.enabled and cfg.degraded_return.wait_quiet
    lp = make_return_loop(cfg, Journal(tmp_path / "j.sqlite"), lambda: True, lambda: None)
    assert lp is not None and lp.interval == 15.0 and lp.wait_quiet
    off = make_config(tmp_path, degraded_return={"enabled": False})
    assert make_return_loop(off, Journal(tmp_path / "j2.sqlite"), lambda: True, lambda: None) is None
    with pytest.raises(ConfigError, match=r"degraded_return\.interval_seconds"):
        make_config(tmp_path, degraded_return={"interval_seconds": 0})


def test_the_intake_records_what_still_firing_reads(journal: Journal) -> None:
    """The alert's firing and resolved deliveries (Alertmanager's send_resolved), through the real
    intake: firing until the resolved one came, even after the drain incident closed."""
    from autoheal.faults import load_fault_catalog
    from autoheal.xid import load_catalog
    from remediation.degraded_return import still_firing
    from remediation.incidents import Intake
    from remediation.models import WebhookPayload
    from tests.remediation.remhelp import payload
    from tests.remediation.test_rem_degraded import RULES, _alert

    intake = Intake(journal, RULES, load_catalog(), 900, load_fault_catalog())
    alert = _alert("gpu-2", "link_flap")
    [iid] = intake.record(WebhookPayload.model_validate(payload(alert))).created
    with journal.transaction() as tx:
        for state in (S.ADMITTED, S.RUNNING, S.COMPLETED):
            tx.transition(iid, state, "done")
    assert still_firing(journal, iid)
    intake.record(WebhookPayload.model_validate(payload(alert)))  # a re-delivery: still one alert
    assert still_firing(journal, iid)
    resolved = {**alert, "status": "resolved", "endsAt": "2026-12-03T20:15:00.000Z"}
    intake.record(WebhookPayload.model_validate(payload(resolved, status="resolved")))
    assert not still_firing(journal, iid)
