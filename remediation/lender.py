"""The lender: the leading runner's loop that lends Slurm nodes to an inference burst and takes
them back (issue 35). What moves where is decided in remediation/lending.py; this module reads the
cluster, applies the moves and reports them.

Every `interval` seconds while this replica leads: the Nodes (their side: the LEND_LABEL; when they
last moved: LEND_MOVED_ANNOTATION; their GPUs: capacity nvidia.com/gpu), the pods of the inference
priority class that request GPUs (Pending and unbound: the demand; bound: what a lent node
serves), Slurm's nodes and the jobs on the busy ones. Each move:

    lend       label lending (+ moved-at), then Slurm DRAIN with LEND_REASON
    drain      Slurm DRAIN again (labelled lending, not drained: a restart in between)
    requeue    `scontrol requeue` the node's jobs (past the grace: SIGTERM, back in the queue)
    lent       label lent: the slurmd DaemonSet's affinity excludes the node, its pod stops and
               its SIGTERM trap deletes the dynamic Slurm node; the GPUs are free for inference
    rollback   Slurm resume, label off (the burst ended before the jobs did)
    return     cordon, label returning (+ moved-at): no new inference pod lands
    evict      the node's inference pods through the Eviction API (PDBs hold)
    returned   label off, uncordon: slurmd comes back and registers the node idle
    resume     Slurm resume of a training node still drained with LEND_REASON

A node the runbook fenced (quarantine label or taint) is left alone whatever its side (the core's
`fenced`): never returned, uncordoned or relabelled under the healing, and its GPUs are not
counted free, so the inference pods the runbook evicted from it lend the next node.

All state is on the Node (label, annotation, cordon) and in Slurm, so a runner restarting mid-move
picks up where it was; the one thing kept in memory is since when a lent node has had no inference
pod (a new leader waits `return_after` again). Every move is a JSON line in the journal, a
Kubernetes Event on the Node (in `event_namespace`) and a notification (`lending.<verb>`); a burst
bigger than the lendable capacity is said once per burst (`lending.short`). dry_run: the moves are
journalled (each once while the plan stays the same) and nothing changes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from autoheal.labels import (
    GPU_RESOURCE,
    LEND_LABEL,
    LEND_MOVED_ANNOTATION,
    LEND_REASON,
    POOL_LABEL,
    QUARANTINE_TAINT_KEY,
    QUARANTINED,
    SPARE_LABEL,
    SPARE_STATE,
    STATE_LABEL,
)
from remediation.cordon_sync import KubeNode, KubeNodes, SlurmCli, SlurmNode, SyncJournal
from remediation.fleetloop import LeaderLoop
from remediation.kubeview import label_is_set
from remediation.lending import (
    Demand,
    Job,
    LendState,
    Move,
    Plan,
    Policy,
    PoolNode,
    checkpoint_of,
    plan,
    state_of,
    update_idle,
)

log = logging.getLogger(__name__)


# --- Kubernetes -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    kube: KubeNode
    gpus: int
    moved_at: float | None


@dataclass(frozen=True)
class InferencePod:
    namespace: str
    name: str
    node: str  # "" while unbound
    gpus: int
    pending: bool  # Pending and unbound: demand


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests (requests, else limits: an extended resource may give either)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(GPU_RESOURCE) or (res.get("limits") or {}).get(GPU_RESOURCE)
        total += _quantity(value or 0)
    return total


def parse_pods(items: Iterable[Mapping[str, Any]], priority_class: str) -> list[InferencePod]:
    out = []
    for p in items:
        meta, spec = p.get("metadata") or {}, p.get("spec") or {}
        if spec.get("priorityClassName") != priority_class or (gpus := pod_gpus(p)) <= 0:
            continue
        phase = (p.get("status") or {}).get("phase")
        node = str(spec.get("nodeName") or "")
        if phase not in ("Pending", "Running"):
            continue
        pending = phase == "Pending" and not node and not meta.get("deletionTimestamp")
        out.append(InferencePod(str(meta.get("namespace")), str(meta.get("name")), node, gpus, pending))
    return out


def parse_node(obj: Mapping[str, Any]) -> NodeView:
    meta = obj.get("metadata") or {}
    moved = (meta.get("annotations") or {}).get(LEND_MOVED_ANNOTATION)
    try:
        moved_at = float(moved) if moved else None
    except ValueError:
        moved_at = 0.0  # unreadable: long ago (the cooldown does not hold it forever)
    capacity = ((obj.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    return NodeView(KubeNode.from_object(obj), _quantity(capacity or 0), moved_at)


class KubeLending(KubeNodes):
    """KubeNodes plus what the lender reads and writes."""

    def views(self) -> list[NodeView]:
        return [parse_node(i) for i in self._list_nodes().get("items") or []]

    def inference_pods(self, priority_class: str) -> list[InferencePod]:
        resp = self._core.list_pod_for_all_namespaces(
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
            _preload_content=False,
            _request_timeout=30,
        )
        return parse_pods(json.loads(resp.data).get("items") or [], priority_class)

    def set_side(
        self, name: str, state: LendState, moved_at: float | None = None, cordon: bool | None = None
    ) -> None:
        """The node's side as its label (training: none), moved-at when given, cordon when given."""
        label = None if state is LendState.TRAINING else state.value
        meta: dict[str, Any] = {"labels": {LEND_LABEL: label}}
        if moved_at is not None:
            meta["annotations"] = {LEND_MOVED_ANNOTATION: f"{moved_at:.0f}"}
        body: dict[str, Any] = {"metadata": meta}
        if cordon is not None:
            body["spec"] = {"unschedulable": cordon}
        self._core.patch_node(name, body, _request_timeout=30)

    def evict(self, namespace: str, name: str) -> None:
        from kubernetes import client

        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            self._core.create_namespaced_pod_eviction(name, namespace, body, _request_timeout=30)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return  # gone already
            raise  # 429: a PDB holds it; the next pass tries again

    def event(self, namespace: str, node: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.lending.", "namespace": namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
            "reason": reason,
            "message": message[:1000],
            "type": "Normal",
            "source": {"component": "autoheal-lender"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._core.create_namespaced_event(namespace, body, _request_timeout=30)


# --- Slurm ------------------------------------------------------------------------------------


def parse_jobs(out: str) -> tuple[Job, ...]:
    """`squeue -o %i|%Q|%t|%k` lines: id, priority, compact state (CG: completing), comment last
    (it may hold the separator)."""
    jobs = []
    for line in out.splitlines():
        parts = line.split("|", 3)
        if len(parts) == 4 and parts[0].strip():
            prio = int(parts[1]) if parts[1].strip().isdigit() else 0
            jobs.append(Job(parts[0].strip(), prio, checkpoint_of(parts[3]), parts[2].strip() == "CG"))
    return tuple(jobs)


class SlurmLending(SlurmCli):
    """SlurmCli plus the jobs on a node and their requeue."""

    def jobs_on(self, node: str) -> tuple[Job, ...]:
        out = self._run("squeue", "-h", "-w", node, "-t", "RUNNING,COMPLETING", "-o", "%i|%Q|%t|%k")
        return parse_jobs(out)

    def requeue(self, job_ids: Sequence[str]) -> None:
        self._run("scontrol", "requeue", ",".join(job_ids))


# --- the loop ---------------------------------------------------------------------------------


def fenced(k: KubeNode) -> bool:
    """Quarantined by the runbook (the fence sets label and taint together; either is enough)."""
    return k.labels.get(STATE_LABEL) == QUARANTINED or any(
        key == QUARANTINE_TAINT_KEY for key, _v, _e in k.taints
    )


def _eligible(k: KubeNode, opt_out_label: str) -> bool:
    return (
        k.ready
        and k.labels.get(STATE_LABEL) not in (QUARANTINED, SPARE_STATE)
        and SPARE_LABEL not in k.labels
        and not label_is_set(k.labels, opt_out_label)
    )


def pool_nodes(
    views: Iterable[NodeView],
    pods: Sequence[InferencePod],
    slurm: Mapping[str, SlurmNode],
    jobs: Callable[[str], tuple[Job, ...]],
    opt_out_label: str,
) -> list[PoolNode]:
    """The core's view of every pool node (a Node with a POOL_LABEL)."""
    out = []
    for v in views:
        k = v.kube
        pool = k.labels.get(POOL_LABEL)
        if not pool:
            continue
        state = state_of(k.labels.get(LEND_LABEL))
        s = slurm.get(k.name)
        on = [p for p in pods if p.node == k.name]
        ask = s is not None and s.busy and state in (LendState.TRAINING, LendState.LENDING)
        out.append(
            PoolNode(
                k.name,
                pool,
                state,
                v.gpus,
                eligible=_eligible(k, opt_out_label),
                in_slurm=s is not None,
                drained=s is not None and s.drained,
                reason=s.reason if s is not None else "",
                busy=s is not None and s.busy,
                jobs=jobs(k.name) if ask else (),
                moved_at=v.moved_at,
                inference_gpus=sum(p.gpus for p in on),
                inference_pods=len(on),
                fenced=fenced(k),
            )
        )
    return out


_EVENT_REASONS = {
    "lend": "LendingToInference",
    "drain": "LendingToInference",
    "requeue": "LendingRequeuedJobs",
    "lent": "LentToInference",
    "rollback": "LendingRolledBack",
    "return": "ReturningToTraining",
    "evict": "ReturningToTraining",
    "returned": "ReturnedToTraining",
    "resume": "ReturnedToTraining",
}


@dataclass
class Lender(LeaderLoop):
    """Every `interval` seconds while `leading()`: read, plan, apply, report."""

    name: ClassVar[str] = "lender"
    kube: KubeLending
    slurm: SlurmLending
    journal: SyncJournal
    policy: Policy
    priority_class: str
    opt_out_label: str
    event_namespace: str = "default"
    dry_run: bool = False
    interval: float = 10.0
    leading: Callable[[], bool] = lambda: True
    notify: Callable[..., None] = lambda event, **fields: None
    count: Callable[[str], None] = lambda verb: None
    report: Callable[[Mapping[str, int], Demand], None] = lambda states, demand: None
    clock: Callable[[], float] = time.time
    last_error: str | None = None
    idle_since: dict[str, float] = field(default_factory=dict)
    short_said: bool = False
    _dry_said: frozenset[tuple[str, str]] = frozenset()
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def reconcile(self) -> Plan:
        views = self.kube.views()
        pods = self.kube.inference_pods(self.priority_class)
        nodes = pool_nodes(views, pods, self.slurm.nodes(), self.slurm.jobs_on, self.opt_out_label)
        demand = Demand(sum(1 for p in pods if p.pending), sum(p.gpus for p in pods if p.pending))
        now = self.clock()
        update_idle(self.idle_since, nodes, now)
        result = plan(nodes, demand, self.policy, now, self.idle_since)
        states: dict[str, int] = {s.value: 0 for s in LendState}
        for n in nodes:
            states[n.state.value] += 1
        self.report(states, demand)
        self._say_short(result, demand)
        if self.dry_run:
            self._dry(result)
            return result
        by_name = {n.name: n for n in nodes}
        for m in result.moves:
            if not self.leading():
                break  # deposed mid-pass: the new leader decides from here
            self._apply(m, by_name[m.node], pods, now)
        return result

    def _say_short(self, result: Plan, demand: Demand) -> None:
        if not result.short:
            self.short_said = self.short_said and demand.pods > 0
            return
        if self.short_said:
            return
        self.short_said = True
        why = (
            f"{demand.pods} pod(s) want {demand.gpus} GPU(s); {result.short_gpus} beyond what may"
            f" be lent ({result.limit})"
        )
        log.warning("lender: burst bigger than the lendable capacity: %s", why)
        self.journal.record({"ts": self.clock(), "action": "short", "why": why, "dry_run": self.dry_run})
        self.notify("lending.short", reason=why)

    def _dry(self, result: Plan) -> None:
        said = frozenset((m.node, m.verb) for m in result.moves)
        for m in result.moves:
            if (m.node, m.verb) not in self._dry_said:
                log.info("lender (dry run): would %s %s (%s)", m.verb, m.node, m.why)
                self.journal.record({**self._entry(m), "dry_run": True})
        self._dry_said = said

    def _entry(self, m: Move) -> dict[str, Any]:
        return {
            "ts": self.clock(),
            "node": m.node,
            "pool": m.pool,
            "action": m.verb,
            "from": m.old.value,
            "to": m.new.value,
            "why": m.why,
        }

    def _apply(self, m: Move, n: PoolNode, pods: Sequence[InferencePod], now: float) -> None:
        if m.verb == "lend":
            self.kube.set_side(m.node, LendState.LENDING, moved_at=now)
            self.slurm.drain([m.node], LEND_REASON)
        elif m.verb == "drain":
            self.slurm.drain([m.node], LEND_REASON)
        elif m.verb == "requeue":
            ids = [j.job_id for j in self.slurm.jobs_on(m.node) if not j.completing]
            if ids:
                self.slurm.requeue(ids)
        elif m.verb == "lent":
            self.kube.set_side(m.node, LendState.LENT)
        elif m.verb == "rollback":
            if n.ours_in_slurm:  # an admin's drain meanwhile stays theirs
                self.slurm.resume([m.node])
            self.kube.set_side(m.node, LendState.TRAINING)
        elif m.verb == "return":
            self.kube.set_side(m.node, LendState.RETURNING, moved_at=now, cordon=True)
        elif m.verb == "evict":
            for p in pods:
                if p.node == m.node:
                    self.kube.evict(p.namespace, p.name)
        elif m.verb == "returned":
            self.kube.set_side(m.node, LendState.TRAINING, cordon=False)
        elif m.verb == "resume":
            self.slurm.resume([m.node])
        self.count(m.verb)
        log.info("lender: %s %s (%s -> %s: %s)", m.verb, m.node, m.old.value, m.new.value, m.why)
        self.journal.record(self._entry(m))
        if m.verb in ("evict", "drain"):
            return  # steps inside a move: journalled, not announced
        message = f"{m.verb}: {m.old.value} -> {m.new.value} ({m.why})"
        try:
            self.kube.event(self.event_namespace, m.node, _EVENT_REASONS[m.verb], message)
        except Exception as exc:  # the move is done; the Event is a report of it
            log.warning("lender: no Event for %s %s: %s", m.verb, m.node, exc)
        self.notify(f"lending.{m.verb}", node=m.node, pool=m.pool, state=m.new.value, reason=m.why)

    def following(self) -> None:
        self.idle_since.clear()  # a follower's timers would be stale when it leads
        self.short_said = False
