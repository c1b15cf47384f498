"""The spare keeper: every pool keeps its declared number of hot spares, on any cloud.

The pools are what the stack declares: ConfigMaps `autoheal-pool-<name>` (labelled
app.kubernetes.io/component=node-pool) in the runner's namespace, key `pool.json`
(components/nodepool.py). A node belongs to the pool its `autoheal.io/pool` label names. The
leading runner reconciles the whole fleet every `interval_seconds` (level-triggered: a restart,
or a new leader, finds the same answer and changes nothing):

    node (of a declared pool, remediation on)     action
    quarantined, opted out, or not Ready          none (the runbook's, a human's, or not up yet)
    autoheal.io/state=spare                       repair: spare label + taint back if removed;
                                                  drained again with the spare reason if Slurm
                                                  shows it idle, with no jobs and no promotion
                                                  comment (slurm_spares marks before it resumes)
    no state, jobs on it in Slurm                 active (a busy node is never made a spare)
    no state, named active in pool.json           active
    no state, pool short of spares                spare: label autoheal.io/spare=true, taint
                                                  autoheal.io/spare=true:NoSchedule, state=spare;
                                                  Slurm drained with exactly SPARE_REASON
    no state, pool has its spares                 active: state=active, spare label/taint off;
                                                  resumed in Slurm if drained JOINING_REASON or
                                                  SPARE_REASON (a bridge registers new nodes so)
    state=active (a promoted spare), anything else  none

New nodes are taken oldest first, nodes already carrying the spare label (the lab's pool
controller makes its new capacity so) before others, so the spare count of a pool is restored by
its next new node after a promotion. Slurm is changed before Kubernetes: a crash in between leaves
the node without a state, decided again on the next pass. A node Slurm does not know yet (its
slurmd not registered) is labelled now; the spare repair drains it once it registers.

Per pool a gauge of spares and of declared spares; one `pool.spares_exhausted` notification
(remediation/notify.py, SpareShortage) when a pool that declares spares has none left, sent again
only after the pool recovered and ran dry again. Each action is a JSON line in the keeper's journal.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from autoheal.labels import (
    ACTIVE_STATE,
    COMPONENT_LABEL,
    JOINING_REASON,
    LEND_LABEL,
    NODE_POOL_COMPONENT,
    POOL_LABEL,
    PROMOTION_PREFIX,
    QUARANTINED,
    SPARE_LABEL,
    SPARE_REASON,
    SPARE_STATE,
    SPARE_TAINT_KEY,
    STATE_LABEL,
)
from remediation.cordon_sync import KubeNode, KubeNodes, Slurm, SlurmNode, SyncJournal
from remediation.errors import RunnerConfigError
from remediation.fleetloop import LeaderLoop
from remediation.kubeview import label_is_set

log = logging.getLogger(__name__)

_OURS_IN_SLURM = (JOINING_REASON, SPARE_REASON)  # drains a new node may carry that the keeper lifts


@dataclass(frozen=True)
class PoolDecl:
    """What the keeper reads of one pool's pool.json."""

    name: str
    spares: int
    remediation: bool = True
    spare_label: tuple[str, str] = (SPARE_LABEL, "true")
    spare_taint: tuple[str, str, str] = (SPARE_TAINT_KEY, "true", "NoSchedule")
    active_names: frozenset[str] = frozenset()


def parse_pool(origin: str, text: str) -> PoolDecl:
    """A pool.json (components/nodepool.py describe_pool); a clear error naming the field."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RunnerConfigError(f"{origin}: pool.json is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise RunnerConfigError(f"{origin}: pool.json must be an object")
    name, spares = doc.get("name"), doc.get("spares")
    if not isinstance(name, str) or not name:
        raise RunnerConfigError(f"{origin}: pool.json: name: a pool name is required")
    if not isinstance(spares, int) or isinstance(spares, bool) or spares < 0:
        raise RunnerConfigError(
            f"{origin}: pool.json: spares: a count (0 or more) is required, got {spares!r}"
        )
    spare = doc.get("spare") or {}
    label = spare.get("label") or {}
    taint = spare.get("taint") or {}
    names = (doc.get("nodeNames") or {}).get("active") or []
    return PoolDecl(
        name=name,
        spares=spares,
        remediation=bool((doc.get("remediation") or {}).get("enabled", True)),
        spare_label=(str(label.get("key") or SPARE_LABEL), str(label.get("value") or "true")),
        spare_taint=(
            str(taint.get("key") or SPARE_TAINT_KEY),
            str(taint.get("value") or "true"),
            str(taint.get("effect") or "NoSchedule"),
        ),
        active_names=frozenset(str(n) for n in names),
    )


@dataclass(frozen=True)
class SpareAction:
    node: str
    pool: str
    verb: str  # "spare" (make or repair a spare) | "active"
    slurm: str  # "drain" | "resume" | "" (nothing in Slurm)
    kube: bool  # whether the Node's labels or taints change
    why: str


def _has_taint(k: KubeNode, taint: tuple[str, str, str]) -> bool:
    return any(t[0] == taint[0] and t[2] == taint[2] for t in k.taints)


def _spare(pool: PoolDecl, k: KubeNode, s: SlurmNode | None, why: str) -> SpareAction:
    """Make (or repair) a spare; `kube`/`slurm` say what is still to change (both empty: nothing)."""
    key, value = pool.spare_label
    marked = k.labels.get(key) == value and k.labels.get(STATE_LABEL) == SPARE_STATE
    slurm = ""
    if s is not None and not (s.drained and s.reason == SPARE_REASON):
        if s.drained:
            slurm = "drain" if s.reason == JOINING_REASON else ""  # an admin's or the runbook's: theirs
        elif not s.busy and not s.comment.startswith(PROMOTION_PREFIX):
            slurm = "drain"  # idle and not being promoted
    return SpareAction(
        k.name, pool.name, "spare", slurm, not (marked and _has_taint(k, pool.spare_taint)), why
    )


def _active(pool: PoolDecl, k: KubeNode, s: SlurmNode | None, why: str) -> SpareAction:
    resume = s is not None and s.drained and s.reason in _OURS_IN_SLURM and not s.busy
    return SpareAction(k.name, pool.name, "active", "resume" if resume else "", True, why)


def _skipped(k: KubeNode, opt_out_label: str) -> bool:
    return (
        k.labels.get(STATE_LABEL) == QUARANTINED
        or label_is_set(k.labels, opt_out_label)
        or not k.ready
        or LEND_LABEL in k.labels  # lent to inference: the lender's (remediation/lender.py)
    )


def _new_first(pool: PoolDecl, k: KubeNode) -> tuple[bool, str, str]:
    return (k.labels.get(pool.spare_label[0]) != pool.spare_label[1], k.created, k.name)


def plan_pool(
    pool: PoolDecl, nodes: Iterable[KubeNode], slurm: Mapping[str, SlurmNode], opt_out_label: str
) -> tuple[list[SpareAction], int]:
    """The table in the module docstring for one pool: the actions, and its spares after them."""
    members = [k for k in nodes if k.labels.get(POOL_LABEL) == pool.name]
    spares = [k for k in members if k.labels.get(STATE_LABEL) == SPARE_STATE]
    if not pool.remediation:
        return [], len(spares)
    repairs = (_spare(pool, k, slurm.get(k.name), "repair") for k in spares if not _skipped(k, opt_out_label))
    actions = [a for a in repairs if a.kube or a.slurm]
    count = len(spares)
    fresh = sorted(
        (k for k in members if STATE_LABEL not in k.labels and not _skipped(k, opt_out_label)),
        key=lambda k: _new_first(pool, k),
    )
    for k in fresh:
        s = slurm.get(k.name)
        if s is not None and s.busy:
            actions.append(_active(pool, k, s, "jobs on it in Slurm"))
        elif k.name in pool.active_names:
            actions.append(_active(pool, k, s, "declared active in pool.json"))
        elif count < pool.spares:
            count += 1
            actions.append(_spare(pool, k, s, f"pool had {count - 1} of {pool.spares} spares"))
        else:
            actions.append(_active(pool, k, s, f"pool has its {pool.spares} spares"))
    return actions, count


# --- Kubernetes -------------------------------------------------------------------------------


class KubePools(KubeNodes):
    """KubeNodes plus what the keeper reads and writes: the pool ConfigMaps, a Node's spare marks."""

    def pools(self, namespace: str) -> list[PoolDecl]:
        """The declared pools; a ConfigMap that cannot be read is logged and left out."""
        if self._core is None:
            self.list()
        selector = f"{COMPONENT_LABEL}={NODE_POOL_COMPONENT}"
        resp = self._core.list_namespaced_config_map(
            namespace, label_selector=selector, _preload_content=False, _request_timeout=30
        )
        out = []
        for cm in json.loads(resp.data).get("items") or []:
            origin = f"ConfigMap {namespace}/{cm['metadata']['name']}"
            try:
                out.append(parse_pool(origin, (cm.get("data") or {}).get("pool.json") or ""))
            except RunnerConfigError as exc:
                log.error("spare keeper: %s", exc)
        return out

    def mark(self, name: str, pool: PoolDecl, spare: bool) -> None:
        """Make the Node a spare (label, taint, state=spare) or active (state=active, neither).
        Read then write with its resourceVersion: a change in between (a fence) is a 409, and the
        next pass decides again."""
        from kubernetes import client

        node = json.loads(self._core.read_node(name, _preload_content=False, _request_timeout=30).data)
        key, value = pool.spare_label
        tkey, tvalue, effect = pool.spare_taint
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != tkey]
        if spare:
            taints.append({"key": tkey, "value": tvalue, "effect": effect})
        labels = {STATE_LABEL: SPARE_STATE if spare else ACTIVE_STATE, key: value if spare else None}
        body = {
            "metadata": {"labels": labels, "resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": taints},
        }
        # a strategic merge patch: labels merge (None removes), spec.taints is replaced whole
        client.CoreV1Api(self._api).patch_node(name, body, _request_timeout=30)


# --- the loop ---------------------------------------------------------------------------------


@dataclass
class SpareKeeper(LeaderLoop):
    """Every `interval` seconds while `leading()`: read pools, Nodes and Slurm; act; report."""

    name: ClassVar[str] = "spare keeper"
    kube: KubePools
    slurm: Slurm
    journal: SyncJournal
    namespace: str
    opt_out_label: str
    interval: float = 15.0
    leading: Callable[[], bool] = lambda: True
    report: Callable[[str, int, int], None] = lambda pool, spares, declared: None
    count: Callable[[str], None] = lambda verb: None
    clock: Callable[[], float] = time.time
    last_error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def reconcile(self) -> list[SpareAction]:
        pools = self.kube.pools(self.namespace)
        nodes, _ = self.kube.list()
        slurm = self.slurm.nodes()
        done: list[SpareAction] = []
        for pool in pools:
            actions, spares = plan_pool(pool, nodes, slurm, self.opt_out_label)
            for a in actions:
                if not self.leading():
                    return done  # deposed mid-pass: the new leader decides from here
                self._apply(pool, a)
                done.append(a)
            if pool.remediation:
                self.report(pool.name, spares, pool.spares)
        return done

    def _apply(self, pool: PoolDecl, a: SpareAction) -> None:
        if a.slurm == "drain":
            self.slurm.drain([a.node], SPARE_REASON)
        elif a.slurm == "resume":
            self.slurm.resume([a.node])
        if a.kube:
            self.kube.mark(a.node, pool, a.verb == "spare")
        self.count(a.verb)
        log.info(
            "spare keeper: %s %s of pool %s (%s; slurm %s)", a.verb, a.node, a.pool, a.why, a.slurm or "-"
        )
        entry: dict[str, Any] = {"ts": self.clock(), "node": a.node, "pool": a.pool, "action": a.verb}
        self.journal.record({**entry, "slurm": a.slurm, "kube": a.kube, "why": a.why})


def default_namespace(configured: str) -> str:
    """The pool ConfigMaps' namespace: configured, else the pod's, else autoheal's own."""
    return configured or os.environ.get("POD_NAMESPACE") or "autoheal"


def journal_path(configured: Path | None, state_dir: Path, name: str) -> Path:
    return configured or state_dir / name
