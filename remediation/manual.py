"""On-call actions on the journal: pause, resume, breaker reset, cancel, and a play run by hand.

These are the CLI's verbs, kept free of any terminal code so tests call them directly. They act
through the journal, so a running `autoheal serve` (another process) sees them on its next tick.
"""

from __future__ import annotations

import getpass
import os
import uuid

from autoheal.errors import ValidationError
from autoheal.names import validate_node_name
from autoheal.xid import load_catalog
from remediation.config import RunnerConfig
from remediation.errors import RemediationError
from remediation.executor import PLAY_TIERS
from remediation.journal import IncidentRecord, Journal
from remediation.kubeview import NullKube
from remediation.metrics import Metrics
from remediation.notify import Notifier
from remediation.policy import BREAKER_KEY, PAUSE_KEY, BreakerState, Policy, breaker_state
from remediation.states import IncidentState
from remediation.worker import Worker


def actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def set_paused(journal: Journal, paused: bool, reason: str = "") -> None:
    with journal.transaction() as tx:
        tx.set_setting(PAUSE_KEY, paused, actor=actor())
        tx.set_setting("pause_reason", reason, actor=actor())


def reset_breaker(journal: Journal, reason: str = "") -> tuple[BreakerState, int]:
    """Close the breaker (a human's act) and return held incidents to the queue."""
    before = breaker_state(journal)
    with journal.transaction() as tx:
        tx.set_setting(BREAKER_KEY, {"open": False, "reason": reason, "tripped_at": None}, actor=actor())
        held = journal.incidents([IncidentState.HELD])
        for inc in held:
            tx.transition(inc.id, IncidentState.PENDING, "breaker reset by " + actor())
            tx.timeline(inc.id, "breaker_reset", "ok", source="cli", detail=reason)
    return before, len(held)


def request_cancel(journal: Journal, incident_id: str) -> IncidentRecord:
    inc = journal.incident(incident_id)
    if inc is None:
        raise RemediationError(f"no incident {incident_id!r}")
    if not inc.is_open:
        raise RemediationError(f"incident {incident_id} is already {inc.state}")
    with journal.transaction() as tx:
        tx.mark(inc.id, cancel_requested=True)
        tx.timeline(inc.id, "cancel_requested", "ok", source="cli", detail="by " + actor())
    return journal.require_incident(incident_id)


def run_by_hand(
    cfg: RunnerConfig,
    journal: Journal,
    playbook: str,
    node: str,
    *,
    check: bool,
    tier: str = "reset",
    xid: int = 0,
    gpu: int | None = None,
    opt_out: bool = False,
) -> IncidentRecord:
    """Run a play for one node now, recorded in the journal as a manual incident and run."""
    from remediation.runtime import make_executor

    try:
        node = validate_node_name(node, "--node")
    except ValidationError as exc:
        raise RemediationError(str(exc)) from exc
    if tier not in PLAY_TIERS:
        raise RemediationError(f"--tier must be one of {sorted(PLAY_TIERS)}")
    executor = make_executor(cfg)
    name = executor.playbook_path(playbook).name
    metrics = Metrics()
    worker = Worker(
        cfg,
        journal,
        Policy(cfg, journal, NullKube(), load_catalog()),
        executor,
        metrics,
        Notifier(cfg.notify, metrics),
    )
    iid = "man-" + uuid.uuid4().hex[:12]
    with journal.transaction() as tx:
        tx.create_incident(
            incident_id=iid,
            node=node,
            gpu=gpu,
            xid=xid,
            fault_class="manual",
            tier=tier,
            fingerprint="manual",
            rule="manual by " + actor(),
            playbook=name,
            extra_vars={},
            rule_dry_run=check,
            state=IncidentState.ADMITTED,
            source="manual",
        )
        tx.mark(iid, opt_out=opt_out, dry_run=check)
        run_id = tx.create_run(
            playbook=name, incident_ids=[iid], nodes=[node], check_mode=check, source="manual"
        )
        tx.update_run(
            run_id, private_dir=str(executor.run_dir(run_id)), events_path=str(executor.events_path(run_id))
        )
        tx.transition(iid, IncidentState.RUNNING, "run by hand", run_id=run_id)
    worker.execute(run_id, [journal.require_incident(iid)])
    return journal.require_incident(iid)
