"""Dead nodes leave Slurm: the record of a dynamic Slurm node whose Kubernetes Node is gone is
deleted, so MaxNodeCount is never used up by machines that no longer exist.

A slurmd pod that stops cleanly takes its node out of Slurm; a machine that vanishes (instance
terminated, kubelet dead and the Node deleted, a backend's retire) leaves a DOWN dynamic record
behind, and those records count against MaxNodeCount until replacements can no longer register.
The leading runner reconciles every `interval_seconds`:

    Slurm node                  Kubernetes Node        action
    static (slurm.conf's)       any                    none: only `slurmd -Z` nodes are deleted
    dynamic                     present                none (its gone-timer is reset)
    dynamic                     gone < grace           wait: a node being re-registered (a kubelet
                                                       recreates its Node within seconds)
    dynamic, jobs allocated     gone >= grace          wait: requeue is the runbook's job; on a
                                                       machine that is really gone slurmctld marks
                                                       the node DOWN after SlurmdTimeout and
                                                       requeues its jobs (JobRequeue=1) itself
    dynamic, no jobs            gone >= grace          delete (`scontrol delete nodename=X`)

A list that misses most dynamic nodes at once (another cluster's kubeconfig, a partial answer)
deletes nothing and is reported as the loop's error. "Gone" is judged by our clock from the
first pass that missed the Node, so a Node deleted while this replica follows is timed from when
it starts leading (a new leader waits one grace more).
A retired instance's Node is deleted by the cloud's node lifecycle controller (or the lab's
retire), so the same rule covers it. Each deletion is a JSON line in the journal, a log line and
a counter; slurmctld refusing one (a job arrived in between) is logged and tried next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from remediation.cordon_sync import KubeNodes, Slurm, SlurmNode, SyncJournal
from remediation.fleetloop import LeaderLoop

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    node: str
    verb: str  # "delete" | "wait"
    why: str


def decide(s: SlurmNode, kube_present: bool, gone_for: float | None, grace: float) -> Verdict | None:
    """The table in the module docstring, for one Slurm node (`gone_for`: seconds since the
    Node was first missed, None while it is present)."""
    if not s.dynamic or kube_present:
        return None
    if gone_for is None or gone_for < grace:
        return Verdict(s.name, "wait", f"Node gone {gone_for or 0:.0f}s, grace {grace:.0f}s")
    if s.busy:
        return Verdict(s.name, "wait", "jobs still allocated on it (slurmctld requeues them once it is DOWN)")
    return Verdict(s.name, "delete", f"Kubernetes Node gone for {gone_for:.0f}s, no job on it")


def plan(
    slurm: Mapping[str, SlurmNode],
    kube: Iterable[str],
    missing_since: dict[str, float],
    now: float,
    grace: float,
) -> list[Verdict]:
    """Every Slurm node's verdict; updates `missing_since` (node -> when first missed)."""
    present = set(kube)
    for name in list(missing_since):
        if name in present or name not in slurm:
            del missing_since[name]
    out = []
    for name, s in sorted(slurm.items()):
        if s.dynamic and name not in present:
            missing_since.setdefault(name, now)
        since = missing_since.get(name)
        v = decide(s, name in present, None if since is None else now - since, grace)
        if v is not None:
            out.append(v)
    return out


def implausible(slurm: Mapping[str, SlurmNode], kube: Iterable[str]) -> str | None:
    """Why this Node list must not be trusted to delete anything, or None: when most dynamic
    Slurm nodes (more than half, and more than two) are missing at once, the likelier cause is a
    kubeconfig of another cluster or a partial list, not a mass death."""
    present = set(kube)
    dynamic = [n for n, s in slurm.items() if s.dynamic]
    gone = [n for n in dynamic if n not in present]
    if len(gone) > 2 and len(gone) * 2 > len(dynamic):
        return f"{len(gone)} of {len(dynamic)} dynamic Slurm nodes have no Kubernetes Node: deleting none"
    return None


@dataclass
class DeadNodes(LeaderLoop):
    """Every `interval` seconds while `leading()`: compare Slurm's nodes with Kubernetes', delete
    the dead dynamic ones."""

    name: ClassVar[str] = "dead nodes"
    kube: KubeNodes
    slurm: Slurm
    journal: SyncJournal
    grace: float = 30.0
    interval: float = 10.0
    leading: Callable[[], bool] = lambda: True
    deleted: Callable[[str], None] = lambda node: None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    last_error: str | None = None
    missing_since: dict[str, float] = field(default_factory=dict)
    _waiting: dict[str, str] = field(default_factory=dict)  # node -> why it waits (grace|jobs)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def reconcile(self) -> list[Verdict]:
        nodes, _ = self.kube.list()
        verdicts = plan(
            self.slurm.nodes(), (k.name for k in nodes), self.missing_since, self.clock(), self.grace
        )
        for v in verdicts:
            if v.verb == "wait":
                kind = "jobs" if v.why.startswith("jobs") else "grace"
                if self._waiting.get(v.node) != kind:  # once per cause, not every pass
                    log.info("dead nodes: %s waits: %s", v.node, v.why)
                self._waiting[v.node] = kind
                continue
            if not self.leading():
                break
            self._delete(v)
        return verdicts

    def _delete(self, v: Verdict) -> None:
        try:
            self.slurm.delete(v.node)
        except RuntimeError as exc:  # slurmctld refused (a job landed meanwhile): next pass
            log.warning("dead nodes: slurmctld kept %s: %s", v.node, exc)
            return
        self.missing_since.pop(v.node, None)
        self._waiting.pop(v.node, None)
        self.deleted(v.node)
        log.warning("dead nodes: deleted Slurm node %s (%s)", v.node, v.why)
        self.journal.record({"ts": self.wall(), "node": v.node, "action": "delete", "why": v.why})

    def following(self) -> None:
        self.missing_since.clear()  # a follower's timers would be stale when it leads
