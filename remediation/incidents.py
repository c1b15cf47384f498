"""Alert -> Incident: normalise each alert, then deduplicate into one open incident per fault.

Normalising is where hostile alert text stops: the node name must pass autoheal.names, the XID and
GPU must be small integers, and only those typed values travel on (never labels or annotations).
The XID watcher's alerts also carry decoded facts of the driver's message (autoheal.xid_messages:
154's recovery action, 144-150's subcode, severity and link) and the message itself; they are
re-validated here into an XidDetail of enums and small integers and a sanitised, bounded message,
handed to the classifier and kept in the incident's timeline, and never passed to a play. The
watcher's kernel record (`kernel_line`, a driver line or nothing: remediation/kernel_lines.py)
is kept there too, for the evidence bundle; the play gets it only as a file the module reads.
Two sources of one fault (the watcher, the dcgm rule, the lost-GPU rule: same alertname and node)
are one incident: they share the node and the fault class.
Dedup keeps Alertmanager's repeats, its resolved notifications and re-fires from starting the
runbook twice: an alert joins the open incident of its (node, fault class); a re-delivery of the
same alert instance (fingerprint + startsAt) joins its incident even after it closed; and any alert
for the same (node, fault class) within the dedup window after an incident closed joins it too,
unless the fault began after that incident returned the node to service (then it is a new fault).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from autoheal.errors import ValidationError
from autoheal.faults import FaultCatalog, load_fault_catalog
from autoheal.monitoring import KERNEL_LINE_ANNOTATION, SOURCE_LABEL
from autoheal.names import validate_node_name
from autoheal.xid import Tier, XidCatalog
from autoheal.xid_messages import XidDetail, sanitise
from remediation.errors import PayloadError
from remediation.journal import IncidentRecord, Journal, Tx
from remediation.kernel_lines import kernel_line
from remediation.models import Alert, WebhookPayload
from remediation.rules import Rule, Rules

_SMALL_INT = re.compile(r"^[0-9]{1,3}$")
_SAFE_KEY = re.compile(r"[^A-Za-z0-9_.:-]")
_SOURCE = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


def _new_since_return(tx: Tx, existing: IncidentRecord, facts: Incident) -> bool:
    """A fault that began after a closed incident's node was returned to service (the ladder
    reset or rebooted it, validated it and gave it back) is a new fault, not a re-fire: joining
    it would leave a failed GPU in service for the rest of the dedup window."""
    if existing.is_open:
        return False
    back = tx.returned_at(existing.id)
    return back is not None and facts.starts_at > back


@dataclass(frozen=True)
class Incident:
    """The typed facts of one alert that the runner may act on."""

    node: str
    gpu: int | None
    xid: int
    fingerprint: str
    tier: Tier
    fault_class: str
    status: str
    starts_at: float
    alertname: str
    rule: Rule
    detail: XidDetail = field(default_factory=XidDetail)  # decoded facts of the driver's message
    message: str = ""  # the driver's message, sanitised (printable ASCII, <= 256 characters)
    source: str = ""  # who saw it: watcher, dcgm, lost-gpu (the alert's `source` label), if valid
    kernel_line: str = ""  # the driver's kernel record (the watcher's), sanitised, for the evidence
    fault: str = ""  # a degraded fault's class, as the fault catalogue names it (autoheal/faults.py)

    def facts(self) -> str:
        """The timeline's record of who saw the fault and what the driver said ("" if nothing)."""
        said = self.message or self.source or self.kernel_line or self.fault
        if self.detail.empty and not said:
            return ""
        data: dict[str, str | float] = {"source": self.source, **self.detail.to_annotations()}
        if self.fault:
            data["fault"] = self.fault
        if self.message:
            data["message"] = self.message
        if self.kernel_line:
            data.update(kernel_line=self.kernel_line, logged_at=self.starts_at)
        return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class Rejected:
    """An alert that matched a rule but carried unusable or hostile values; never acted on."""

    reason: str


Routed = tuple[Alert, "Incident | Rejected | None"]


@dataclass
class DeliveryResult:
    """What one webhook delivery did; returned to Alertmanager as JSON."""

    created: list[str] = field(default_factory=list)
    joined: list[str] = field(default_factory=list)
    unrouted: int = 0
    rejected: int = 0
    resolved_unmatched: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "created": self.created,
            "joined": self.joined,
            "unrouted": self.unrouted,
            "rejected": self.rejected,
            "resolved_unmatched": self.resolved_unmatched,
        }


def classify(rule: Rule, catalog: XidCatalog, xid: int, detail: XidDetail) -> Tier:
    """The rung of a fault: the rule's when it names one, else the catalogue's resolution of the
    XID with the decoded facts of its message (154's recovery action, 144-150's subcode severity;
    autoheal.xid.XidCatalog.resolve). Facts that are missing or did not validate fall back to the
    XID's most cautious rung, and an XID the catalogue does not know is quarantined
    (docs/architecture.md, "Fault classes and the recovery ladder")."""
    return rule.tier or catalog.resolve(xid, detail).tier


def _degraded(rule: Rule, labels: dict[str, str], faults: FaultCatalog) -> tuple[str, Tier] | Rejected:
    """A degraded fault's class and rung: the label must name a class of the fault catalogue
    (exactly: alert text is never trusted to be what it says), the rung is the catalogue's."""
    assert rule.fault_label is not None
    entry = faults.get(labels.get(rule.fault_label, ""))
    if entry is None:
        return Rejected(
            f"label {rule.fault_label} is missing or not a fault class of catalogue v{faults.version}"
        )
    return entry.name.value, rule.tier or entry.tier


def normalise(
    alert: Alert, rule: Rule, catalog: XidCatalog, faults: FaultCatalog | None = None
) -> Incident | Rejected:
    """Turn a routed alert into an Incident, or a Rejected with a reason (no alert text in it)."""
    labels = alert.labels
    node_label = next((n for n in rule.node_labels if n in labels), None)
    if node_label is None:
        return Rejected(f"no node label (looked for {', '.join(rule.node_labels)})")
    try:
        node = validate_node_name(labels[node_label], field=f"label {node_label}")
    except ValidationError:
        return Rejected(f"label {node_label} is not a valid node name")
    degraded: tuple[str, Tier] | None = None
    if rule.fault_label is not None:
        found = _degraded(rule, labels, faults or load_fault_catalog())
        if isinstance(found, Rejected):
            return found
        degraded = found
    raw_xid = labels.get(rule.xid_label)
    if raw_xid is not None and _SMALL_INT.fullmatch(raw_xid) and 0 < int(raw_xid) < 1000:
        xid = int(raw_xid)
    elif raw_xid is None and (rule.tier is not None or degraded is not None):
        xid = 0
    else:
        return Rejected(f"label {rule.xid_label} is missing or not an XID number")
    raw_gpu = labels.get(rule.gpu_label)
    gpu = (
        int(raw_gpu) if raw_gpu is not None and _SMALL_INT.fullmatch(raw_gpu) and int(raw_gpu) < 64 else None
    )
    detail = XidDetail.from_annotations(dict(alert.annotations))
    tier = degraded[1] if degraded is not None else classify(rule, catalog, xid, detail)
    source = labels.get(SOURCE_LABEL, "")
    parts = [rule.fault_class + (":notify" if tier is Tier.NOTIFY else "")]
    parts += [_SAFE_KEY.sub("_", labels.get(k, ""))[:64] for k in rule.group_by if k not in rule.node_labels]
    return Incident(
        node=node,
        gpu=gpu,
        xid=xid,
        fingerprint=alert.fingerprint,
        tier=tier,
        fault_class="/".join(parts),
        status=alert.status,
        starts_at=alert.startsAt.timestamp(),
        alertname=labels.get("alertname", ""),
        rule=rule,
        detail=detail,
        message=sanitise(alert.annotations.get("message", "")),
        source=source if _SOURCE.fullmatch(source) else "",
        kernel_line=kernel_line(alert.annotations.get(KERNEL_LINE_ANNOTATION, "")),
        fault=degraded[0] if degraded is not None else "",
    )


class Intake:
    """Records a webhook delivery in the journal, deduplicating into incidents, atomically."""

    def __init__(
        self,
        journal: Journal,
        rules: Rules,
        catalog: XidCatalog,
        dedup_window_seconds: int,
        faults: FaultCatalog | None = None,
    ) -> None:
        self.journal = journal
        self.rules = rules
        self.catalog = catalog
        self.faults = faults or load_fault_catalog()
        self.dedup_window = dedup_window_seconds

    def route(self, payload: WebhookPayload) -> list[Routed]:
        """Route and normalise every alert (no I/O).

        Raises PayloadError (nothing to record) when alerts matched rules but none was usable,
        so a payload made only of hostile alerts is refused with a 4xx.
        """
        routed: list[Routed] = []
        for alert in payload.alerts:
            rule = self.rules.route(alert.labels)
            routed.append(
                (alert, None if rule is None else normalise(alert, rule, self.catalog, self.faults))
            )
        usable = [x for _, x in routed if isinstance(x, Incident)]
        rejected = [x for _, x in routed if isinstance(x, Rejected)]
        if rejected and not usable:
            raise PayloadError("no usable alert: " + "; ".join(sorted({r.reason for r in rejected})))
        return routed

    def record(self, payload: WebhookPayload, now: float | None = None) -> DeliveryResult:
        """Journal every alert and open or join incidents; one transaction, all or nothing."""
        routed = self.route(payload)
        with self.journal.transaction(now) as tx:
            return self.apply(tx, routed)

    def apply(self, tx: Tx, routed: list[Routed]) -> DeliveryResult:
        """Write one routed delivery inside the caller's transaction (dedup happens here)."""
        result = DeliveryResult()
        for alert, facts in routed:

            def log(outcome: str, reason: str = "", incident_id: str | None = None, a: Alert = alert) -> None:
                tx.add_alert(
                    fingerprint=a.fingerprint,
                    starts_at=a.startsAt.timestamp(),
                    status=a.status,
                    alertname=a.labels.get("alertname", ""),
                    labels=dict(a.labels),
                    outcome=outcome,
                    reason=reason,
                    incident_id=incident_id,
                )

            if facts is None:
                result.unrouted += 1
                log("unrouted")
                continue
            if isinstance(facts, Rejected):
                result.rejected += 1
                log("rejected", facts.reason)
                continue
            window = facts.rule.dedup_window_seconds
            window = self.dedup_window if window is None else window
            existing_id = tx.incident_of_alert(facts.fingerprint, facts.starts_at)
            first_sight = existing_id is None  # not a re-delivery of an alert already recorded
            existing = tx.get(existing_id) if existing_id else None
            if existing is None or (existing.node, existing.fault_class) != (facts.node, facts.fault_class):
                existing = tx.find_joinable(facts.node, facts.fault_class, tx.now - window)
                if existing is not None and _new_since_return(tx, existing, facts):
                    existing = None
            resolved = facts.status == "resolved"
            if existing is not None:
                upgrade = facts.tier.value if Tier(existing.tier).rank < facts.tier.rank else None
                tx.join(existing.id, resolved=resolved, tier=upgrade)
                if resolved:
                    tx.timeline(existing.id, "alert_resolved", "ok", source="alertmanager")
                elif first_sight and (said := facts.facts()):
                    tx.timeline(existing.id, "alert_facts", "ok", source="alertmanager", detail=said)
                log("joined", incident_id=existing.id)
                if existing.id not in result.joined and existing.id not in result.created:
                    result.joined.append(existing.id)
            elif resolved:
                result.resolved_unmatched += 1
                log("resolved_unmatched")
            else:
                iid = tx.create_incident(
                    node=facts.node,
                    gpu=facts.gpu,
                    xid=facts.xid,
                    fault_class=facts.fault_class,
                    tier=facts.tier.value,
                    fingerprint=facts.fingerprint,
                    rule=facts.rule.name,
                    playbook=facts.rule.playbook,
                    extra_vars=facts.rule.extra_vars,
                    rule_dry_run=facts.rule.dry_run,
                )
                if said := facts.facts():
                    tx.timeline(iid, "alert_facts", "ok", source="alertmanager", detail=said)
                log("incident", incident_id=iid)
                result.created.append(iid)
        return result
