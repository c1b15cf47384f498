"""One incident per failure domain (issue 36): a leaf switch that flaps takes every node under it
with it, and draining them one by one would drain the rack for a fault that is the switch's.

The policy (remediation/policy.py) asks this module about each pending degraded incident of a
shared fault class (`failure_domains.faults`: link flaps, NIC errors) whose node has a domain
(`failure_domains.label` on the Kubernetes Node, else `failure_domains.nodes`):

    the domain's nodes with such a fault          call
    (incidents opened within window_seconds)
    a domain incident stands (within the window)  join: this incident joins it (no drain, no page)
    >= min_nodes                                  lead: the oldest pending one is the domain's
                                                  incident (notified: one page naming the domain
                                                  and its nodes); the others join it
    fewer, incident younger than hold_seconds     wait: the domain's other alerts may be on their way
    fewer, held long enough                       none: the node's own fault, drained as usual

A node drained before its domain reached `min_nodes` stays drained (its own incident ran); its
peers are not. Members are closed notified with the notify tier, so a switch that flaps again
and again puts no node on the way to the per-node cap or the escalation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

from remediation.config import FailureDomains
from remediation.degraded_return import RETURN_SOURCE, fault_of
from remediation.errors import KubeError
from remediation.journal import IncidentRecord, Journal
from remediation.kubeview import KubeView
from remediation.states import IncidentState

DOMAIN_REASON = "failure domain "  # the lead's reason: "failure domain <domain>: ..."
JOINED = "joined_domain"  # a member's timeline phase (detail: the lead's id)

Call = Literal["lead", "join", "wait"]


@dataclass(frozen=True)
class DomainCall:
    call: Call
    domain: str
    reason: str
    lead: str = ""  # the domain incident a member joins


class Domains:
    def __init__(self, settings: FailureDomains, journal: Journal, kube: KubeView) -> None:
        self.s = settings
        self.journal = journal
        self.kube = kube

    def judge(self, pending: list[IncidentRecord], now: float) -> dict[str, DomainCall]:
        """The call on each pending incident of a shared fault with a domain (the table above)."""
        s = self.s
        if not (s.label or s.nodes):
            return {}
        mine = [i for i in pending if i.tier == "drain" and fault_of(self.journal, i.id) in s.faults]
        if not mine:
            return {}
        recent = self._recent(now)
        domain = self._domains({i.node for i in mine} | {i.node for i in recent})
        members: dict[str, set[str]] = defaultdict(set)
        leads: dict[str, str] = {}
        for inc in recent:
            if (d := domain.get(inc.node)) is not None:
                members[d].add(inc.node)
                if inc.state is IncidentState.NOTIFIED and inc.reason.startswith(f"{DOMAIN_REASON}{d}:"):
                    leads.setdefault(d, inc.id)
        out: dict[str, DomainCall] = {}
        for inc in sorted(mine, key=lambda i: (i.opened_at, i.id)):
            d = domain.get(inc.node)
            if d is None:
                continue
            nodes = members[d] | {inc.node}
            if d in leads:
                out[inc.id] = DomainCall("join", d, f"joined the incident of failure domain {d}", leads[d])
            elif len(nodes) >= s.min_nodes:
                leads[d] = inc.id
                out[inc.id] = DomainCall("lead", d, self._lead_reason(d, nodes))
            elif now - inc.opened_at < s.hold_seconds:
                out[inc.id] = DomainCall(
                    "wait", d, f"waiting {s.hold_seconds:g}s for other nodes of failure domain {d}"
                )
        return out

    def _lead_reason(self, domain: str, nodes: set[str]) -> str:
        s = self.s
        names = ", ".join(sorted(nodes)[:20]) + (" ..." if len(nodes) > 20 else "")
        return (
            f"{DOMAIN_REASON}{domain}: {len(nodes)} nodes with {'/'.join(s.faults)} within"
            f" {s.window_seconds:g}s ({names}); one incident for the domain, no node drained"
            " - suspect the switch or the rack, a human looks"
        )

    def _recent(self, now: float) -> list[IncidentRecord]:
        """Incidents of a shared fault opened within the window (pending ones included)."""
        since = now - self.s.window_seconds
        return [
            i
            for i in self.journal.incidents()
            if i.opened_at >= since
            and i.source != RETURN_SOURCE
            and i.tier in ("drain", "notify", "quarantine")
            and fault_of(self.journal, i.id) in self.s.faults
        ]

    def _domains(self, nodes: set[str]) -> dict[str, str]:
        """Each node's domain: its label, else the static map. A cluster that cannot be read
        leaves the static map alone (the faults are then each node's own)."""
        found = {n: d for n, d in self.s.nodes.items() if n in nodes}
        if self.s.label:
            try:
                labelled = self.kube.pools(self.s.label, sorted(nodes))
            except KubeError:
                labelled = {}
            found.update({n: d for n, d in labelled.items() if n in nodes and d})
        return found
