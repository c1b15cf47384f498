"""Degraded nodes back to service (issue 36): a node the gentle rung drained (playbooks/gpu_degraded.yml:
Slurm DRAIN, the job runs on) is validated once its jobs have ended, and returned if it passes.

Every `degraded_return.interval_seconds` while this replica leads, the loop reads the journal's
completed drain incidents of the degraded play (closed within `lookback_seconds`) that it has not
settled yet, and Slurm's nodes (one `sinfo`, only when there is such an incident):

    Slurm node                                   verdict
    gone from Slurm                              drop (nothing to return)
    not drained, or a reason not autoheal's      drop (resumed or taken over by a human)
      degraded drain
    drained by autoheal, jobs still on it        wait (the job finishes or checkpoints first)
    drained by autoheal, idle, alert resolved    queue: a `degraded_return.yml` incident
    idle but its alert still fires (wait_quiet)  wait: a link that flapped returns once it has
                                                 been quiet for the fault's window (a pending row
                                                 remap does not wait: only its reset clears it)
    another open incident on the node            wait (that incident's play acts first)

A node drained twice keeps its newest incident; the older ones are dropped ("superseded"). A queued
incident is admitted at once (the policy admitted the drain; this is its follow-up), runs
playbooks/degraded_return.yml - a GPU reset first for a pending row remap (the remap applies at the
reset), validation (the simulator's health check in the lab, DCGM diagnostics in production), then
the return (Slurm resume, uncordon, taint off), or, on a failed validation, the next rung:
quarantine (the node stays drained, the quarantine taint, the incident fails and pages a human).
Return incidents have the journal source `return` and count toward no cap or escalation.

What the loop decided is written on the drain incident's timeline (`validation_queued` ok with the
return incident's id, or `skipped` with why), so a restart or a new leader repeats nothing; the
return incident's `returned` is copied onto the drain incident, so a new fault after the return is
a new incident, not a re-fire of the old one (remediation/incidents.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from remediation.config import RunnerConfig
from remediation.cordon_sync import SlurmCli, SlurmNode
from remediation.fleetloop import LeaderLoop
from remediation.journal import IncidentRecord, Journal
from remediation.states import OPEN_STATES, IncidentState

log = logging.getLogger(__name__)
DEGRADED_PLAYBOOK = "gpu_degraded.yml"
RETURN_PLAYBOOK = "degraded_return.yml"
RETURN_SOURCE = "return"  # the journal source of return incidents (remediation/journal.py counts)
RETURN_FAULT_CLASS = "degraded-return"
QUEUED = "validation_queued"  # on the drain incident: ok (queued: the return incident) or skipped
RETURNED = "returned"
DEGRADED_REASON = "autoheal: degraded drain"  # the drain rung's Slurm reason (not quarantine's)
FINGERPRINT = "return:"  # + the drain incident's id

Verb = Literal["queue", "wait", "drop"]


@dataclass(frozen=True)
class Verdict:
    incident: str
    node: str
    verb: Verb
    why: str


class SlurmNodes(Protocol):
    def nodes(self) -> dict[str, SlurmNode]: ...


def decide(
    inc: IncidentRecord, s: SlurmNode | None, open_nodes: frozenset[str] = frozenset(), firing: bool = False
) -> Verdict:
    """The table in the module docstring, for one drain incident and its node's Slurm record
    (`firing`: its alert has not resolved, and the loop waits for that)."""

    def v(verb: Verb, why: str) -> Verdict:
        return Verdict(inc.id, inc.node, verb, why)

    if s is None:
        return v("drop", "node gone from Slurm")
    if not s.drained:
        return v("drop", "back in service (resumed by hand)")
    if not s.reason.startswith(DEGRADED_REASON):
        return v("drop", f"Slurm reason is not autoheal's degraded drain: {s.reason[:120]!r}")
    if inc.node in open_nodes:
        return v("wait", "another incident of the node is open")
    if s.busy:
        return v("wait", "jobs still running on it")
    if firing:
        return v("wait", "its alert still fires: the fault must be quiet before the validation")
    return v("queue", "idle: its jobs ended")


def fault_of(journal: Journal, incident_id: str) -> str:
    """The degraded fault class the alert named (its `alert_facts`), '' when unknown."""
    for e in journal.timeline(incident_id):
        if e.phase == "alert_facts" and e.detail.startswith("{"):
            try:
                fault = json.loads(e.detail).get("fault")
            except ValueError:
                continue
            if isinstance(fault, str):
                return fault
    return ""


def still_firing(journal: Journal, incident_id: str) -> bool:
    """Whether an alert of the incident has not resolved: more alerts seen (`alert_facts`, once
    per alert) than resolved (`alert_resolved`, Alertmanager's send_resolved)."""
    phases = [e.phase for e in journal.timeline(incident_id)]
    return phases.count("alert_facts") > phases.count("alert_resolved")


def is_drain(inc: IncidentRecord) -> bool:
    """A completed drain of the degraded play, run for real (a dry run drained nothing)."""
    return (
        inc.playbook == DEGRADED_PLAYBOOK
        and inc.tier == "drain"
        and inc.state is IncidentState.COMPLETED
        and not inc.dry_run
        and inc.source != RETURN_SOURCE
    )


def queue_return(journal: Journal, inc: IncidentRecord, fault: str, why: str) -> str:
    """Admit the return incident of drain incident `inc`; its id (one transaction, both timelines)."""
    with journal.transaction() as tx:
        iid = tx.create_incident(
            node=inc.node,
            gpu=inc.gpu,
            xid=0,
            fault_class=RETURN_FAULT_CLASS,
            tier="drain",
            fingerprint=FINGERPRINT + inc.id,
            rule=f"validate and return after {inc.id}",
            playbook=RETURN_PLAYBOOK,
            extra_vars={"autoheal_fault": fault} if fault else {},
            rule_dry_run=False,
            state=IncidentState.ADMITTED,
            source=RETURN_SOURCE,
        )
        tx.timeline(iid, "drained_by", "ok", source="runner", detail=inc.id)
        tx.timeline(inc.id, QUEUED, "ok", source="runner", detail=f"{iid}: {why}")
    return iid


@dataclass
class DegradedReturn(LeaderLoop):
    """The leader's loop (remediation/fleetloop.py); `wake` hurries the worker to the new incident."""

    name: ClassVar[str] = "degraded return"
    journal: Journal
    slurm: SlurmNodes
    interval: float
    lookback: float
    leading: Callable[[], bool]
    wake: Callable[[], None] = lambda: None
    wait_quiet: bool = False  # wait for the drain's alert to resolve (not for a pending remap)
    last_error: str | None = None
    _settled: set[str] = field(default_factory=set)  # drain incidents decided, returns copied
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def reconcile(self) -> list[Verdict]:
        now = time.time()
        closed = self.journal.closed_since(now - self.lookback, [IncidentState.COMPLETED])
        recent = [i for i in closed if i.id not in self._settled]
        self._copy_returns([i for i in recent if i.source == RETURN_SOURCE])
        drains = [i for i in recent if is_drain(i) and not self._decided(i.id)]
        if not drains:
            return []
        slurm = self.slurm.nodes()
        open_nodes = frozenset(i.node for i in self.journal.incidents(OPEN_STATES))
        newest: dict[str, IncidentRecord] = {}
        for inc in sorted(drains, key=lambda i: (i.closed_at or 0, i.opened_at)):
            newest[inc.node] = inc
        out = []
        for inc in drains:
            if newest[inc.node] is not inc:
                out.append(Verdict(inc.id, inc.node, "drop", f"superseded by {newest[inc.node].id}"))
            else:
                out.append(decide(inc, slurm.get(inc.node), open_nodes, self._firing(inc)))
        self._apply(out, {i.id: i for i in drains})
        return out

    def _firing(self, inc: IncidentRecord) -> bool:
        """With `wait_quiet`, whether its alert still fires. A link that flapped is returned once it
        has been quiet for the fault's window, not while it may still flap; a pending row remap is
        never quiet until the reset the validation starts with, so it does not wait."""
        if not self.wait_quiet or fault_of(self.journal, inc.id) == "row_remap_pending":
            return False
        return still_firing(self.journal, inc.id)

    def _decided(self, incident_id: str) -> bool:
        """Whether the drain incident was queued or dropped already (by this or a former leader)."""
        if any(e.phase == QUEUED for e in self.journal.timeline(incident_id)):
            self._settled.add(incident_id)
            return True
        return False

    def _apply(self, verdicts: list[Verdict], drains: Mapping[str, IncidentRecord]) -> None:
        queued = 0
        for v in verdicts:
            if v.verb == "queue":
                fault = fault_of(self.journal, v.incident)
                iid = queue_return(self.journal, drains[v.incident], fault, v.why)
                log.info("degraded return: %s is idle; validating it (incident %s)", v.node, iid)
                queued += 1
            elif v.verb == "drop":
                with self.journal.transaction() as tx:
                    tx.timeline(v.incident, QUEUED, "skipped", source="runner", detail=v.why)
                log.info("degraded return: %s left alone: %s", v.node, v.why)
            else:
                continue
            self._settled.add(v.incident)
        if queued:
            self.wake()

    def _copy_returns(self, returns: list[IncidentRecord]) -> None:
        """A completed return's `returned` onto its drain incident (at the same time)."""
        for ret in returns:
            if ret.fingerprint.startswith(FINGERPRINT):
                drain = ret.fingerprint[len(FINGERPRINT) :]
                with self.journal.transaction() as tx:
                    back = tx.returned_at(ret.id)
                    if back is not None and tx.returned_at(drain) is None and tx.get(drain) is not None:
                        detail = f"validated by {ret.id}"
                        tx.timeline(drain, RETURNED, "ok", source="runner", ts=back, detail=detail)
            self._settled.add(ret.id)


def make_return_loop(
    cfg: RunnerConfig, journal: Journal, leading: Callable[[], bool], wake: Callable[[], None]
) -> DegradedReturn | None:
    """The loop, unless `degraded_return.enabled` is off; Slurm through the plays' slurm.conf."""
    s = cfg.degraded_return
    if not s.enabled:
        return None
    conf = cfg.play_vars.get("autoheal_slurm_conf")
    slurm = SlurmCli(Path(str(conf)) if conf else None)
    return DegradedReturn(
        journal, slurm, s.interval_seconds, s.lookback_seconds, leading, wake, wait_quiet=s.wait_quiet
    )
