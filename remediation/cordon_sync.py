"""Kubernetes and Slurm in step: a node an operator cordons or taints by hand is drained in Slurm,
and resumed when the hold is lifted (docs/architecture.md, "Cordon sync").

"GPU nodes are Kubernetes nodes first": an operator who cordons a node for maintenance expects
nothing new to land on it, and Slurm's jobs are what lands on a GPU node. So a watch on the
Nodes drives one level-triggered reconcile of the whole fleet:

    Kubernetes holds the node         Slurm                          action
    (cordon, or a NoSchedule/         not drained                    drain, reason SYNC_REASON...
     NoExecute taint not ignored)     drained/down, any reason       none (ours already, the
                                                                     runbook's, or an admin's)
    no hold                           drained/down with SYNC_REASON  resume
    no hold                           anything else                  none (an admin's drain is
                                                                     never touched)

Nodes the runbook owns (labelled quarantined or spare) and nodes lent to inference (the lender's
label, remediation/lender.py) are left to them; the runbook, which sets its own
reasons. Taints Kubernetes sets itself (node.kubernetes.io/...), ours (autoheal.io/...) and the
GPU pools' declared taint (nvidia.com/gpu) are not holds; `ignore_taints` names them. The Slurm
node is the Kubernetes node of the same name (the lab, and the slurmd pods' dynamic nodes).

Every action is appended to a JSON-lines journal (fsync'd) with the Kubernetes cause and the
seconds from the Node's change being seen to Slurm acting. The watch restarts with a fresh list
(and a client that reads the rotating ServiceAccount token again) every `resync_seconds`, so a
change made in Slurm alone (an admin resuming a node we drained) is corrected within that time.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from autoheal.backoff import Backoff
from autoheal.labels import LEND_LABEL, QUARANTINED, SPARE_LABEL, STATE_LABEL

log = logging.getLogger(__name__)

SYNC_REASON = "autoheal: cordoned in Kubernetes"
DEFAULT_IGNORED_TAINTS: tuple[str, ...] = (
    "node.kubernetes.io/",  # not-ready, unreachable, unschedulable (the cordon's own mirror), ...
    "node.cloudprovider.kubernetes.io/",
    "autoheal.io/",  # ours: quarantine and spare, owned by the runbook
    "nvidia.com/gpu",  # the GPU pools' declared taint
)
_HOLD_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class KubeNode:
    """What the sync needs of a Node."""

    name: str
    unschedulable: bool = False
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True  # the Ready condition (the spare keeper decides only on Ready nodes)
    created: str = ""  # creationTimestamp (RFC 3339): the spare keeper takes new nodes oldest first

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> KubeNode:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        taints = tuple(
            (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in spec.get("taints") or []
        )
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        created = str(meta.get("creationTimestamp") or "")
        return cls(str(meta["name"]), bool(spec.get("unschedulable")), taints, labels, ready, created)

    def owned_by_runbook(self) -> bool:
        """Quarantined, a spare, or lent to inference (the lender cordons a returning node)."""
        return (
            self.labels.get(STATE_LABEL) == QUARANTINED
            or SPARE_LABEL in self.labels
            or LEND_LABEL in self.labels
        )

    def hold(self, ignore: Sequence[str]) -> str | None:
        """Why Kubernetes keeps work off this node ("cordoned", "taint k=v:NoSchedule"), or None."""
        if self.unschedulable:
            return "cordoned"
        for key, value, effect in self.taints:
            if effect in _HOLD_EFFECTS and not _ignored(key, ignore):
                return f"taint {key}{'=' + value if value else ''}:{effect}"
        return None


def _ignored(key: str, ignore: Sequence[str]) -> bool:
    return any(key == p or (p.endswith("/") and key.startswith(p)) for p in ignore)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    drained: bool  # DRAIN flag, or DOWN: no new job lands either way
    reason: str
    dynamic: bool = False  # registered by `slurmd -Z` (DYNAMIC_NORM): may be deleted, unlike slurm.conf's
    busy: bool = False  # jobs allocated or completing on it (ALLOCATED, MIXED, COMPLETING, alloc_cpus)
    comment: str = ""  # the node comment (a promoted spare's "autoheal: replaces ...")


@dataclass(frozen=True)
class Action:
    node: str
    verb: str  # "drain" | "resume"
    reason: str  # the Slurm reason set (drain) or removed (resume)
    cause: str  # what Kubernetes shows ("cordoned", "taint ...", "hold lifted")


def decide(k: KubeNode, s: SlurmNode | None, ignore: Sequence[str]) -> Action | None:
    """The table in the module docstring, for one node."""
    if s is None or k.owned_by_runbook():
        return None
    cause = k.hold(ignore)
    if cause is not None:
        if s.drained:
            return None
        reason = SYNC_REASON if cause == "cordoned" else f"{SYNC_REASON} ({cause})"
        return Action(k.name, "drain", reason, cause)
    if s.drained and s.reason.startswith(SYNC_REASON):
        return Action(k.name, "resume", s.reason, "hold lifted")
    return None


def plan(nodes: Iterable[KubeNode], slurm: Mapping[str, SlurmNode], ignore: Sequence[str]) -> list[Action]:
    return [a for k in nodes if (a := decide(k, slurm.get(k.name), ignore)) is not None]


# --- Slurm ------------------------------------------------------------------------------------


def _flags(node: Mapping[str, Any]) -> set[str]:
    """State words of a `sinfo --json` node: 22.05 has state "idle" + state_flags, 24.11 a list."""
    state = node.get("state")
    words = set(state) if isinstance(state, list) else {str(state or "")}
    words |= set(node.get("state_flags") or [])
    return {str(w).upper() for w in words}


_BUSY = {"ALLOCATED", "MIXED", "COMPLETING"}


def _alloc_cpus(node: Mapping[str, Any]) -> int:
    value = node.get("alloc_cpus")
    if isinstance(value, dict):  # 24.x "number" objects: {"set", "infinite", "number"}
        value = value.get("number")
    return value if isinstance(value, int) else 0


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    out = {}
    for node in json.loads(text).get("nodes") or []:
        flags = _flags(node)
        out[str(node["name"])] = SlurmNode(
            str(node["name"]),
            bool(flags & {"DRAIN", "DOWN"}),
            str(node.get("reason") or ""),
            dynamic="DYNAMIC_NORM" in flags,
            busy=bool(flags & _BUSY) or _alloc_cpus(node) > 0,
            comment=str(node.get("comment") or ""),
        )
    return out


class SlurmCli:
    """Slurm through its own commands (sinfo, scontrol) with the runner's slurm.conf."""

    def __init__(self, slurm_conf: Path | None, timeout: float = 20.0) -> None:
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._timeout = timeout
        self._grouped = False  # sinfo --json groups nodes (24.x): read them with scontrol

    def _run(self, *argv: str) -> str:
        res = subprocess.run(list(argv), env=self._env, capture_output=True, text=True, timeout=self._timeout)
        if res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])}: rc={res.returncode}: {res.stderr.strip()[:300]}")
        return res.stdout

    def nodes(self) -> dict[str, SlurmNode]:
        """Every node with its own reason. 24.x `sinfo --json` groups nodes by state with one
        reason per group (and no "nodes" list): there each node comes from `scontrol show nodes
        --json`, which 22.05 does not have (the collection's Slurm helper does the same)."""
        if not self._grouped:
            text = self._run("sinfo", "--json")
            if "sinfo" not in json.loads(text):
                return parse_sinfo(text)
            self._grouped = True
        return parse_sinfo(self._run("scontrol", "show", "nodes", "--json"))

    def drain(self, names: Sequence[str], reason: str) -> None:
        self._run("scontrol", "update", f"nodename={','.join(names)}", "state=drain", f"reason={reason}")

    def resume(self, names: Sequence[str]) -> None:
        self._run("scontrol", "update", f"nodename={','.join(names)}", "state=resume")

    def delete(self, name: str) -> None:
        """Remove a dynamic node's record (slurmctld refuses a node with jobs, or a static one)."""
        self._run("scontrol", "delete", f"nodename={name}")


class Slurm(Protocol):
    def nodes(self) -> dict[str, SlurmNode]: ...
    def drain(self, names: Sequence[str], reason: str) -> None: ...
    def resume(self, names: Sequence[str]) -> None: ...
    def delete(self, name: str) -> None: ...


# --- Kubernetes -------------------------------------------------------------------------------


class NodeSource(Protocol):
    def list(self) -> tuple[list[KubeNode], str]:
        """Every node and the list's resourceVersion."""
        ...

    def watch(self, resource_version: str, timeout: int) -> Iterator[tuple[str, KubeNode]]:
        """(event type, node) from resource_version until timeout seconds pass."""
        ...


class KubeNodes:
    """Nodes through the kubernetes client; a new client per list so a rotated token is read."""

    def __init__(self, kubeconfig: Path) -> None:
        self._kubeconfig = kubeconfig
        self._api: Any = None
        self._core: Any = None

    def list(self) -> tuple[list[KubeNode], str]:
        data = self._list_nodes()
        return [KubeNode.from_object(i) for i in data.get("items") or []], str(
            data["metadata"]["resourceVersion"]
        )

    def _list_nodes(self) -> dict[str, Any]:
        """The NodeList as plain JSON, through a new client (a rotated token is read)."""
        from kubernetes import client, config

        if self._api is not None:
            self._api.close()  # the previous relist's connection pool
        self._api = config.new_client_from_config(config_file=str(self._kubeconfig))
        self._core = client.CoreV1Api(self._api)
        resp = self._core.list_node(_preload_content=False, _request_timeout=30)
        data: dict[str, Any] = json.loads(resp.data)
        return data

    def watch(self, resource_version: str, timeout: int) -> Iterator[tuple[str, KubeNode]]:
        from kubernetes import watch

        stream = watch.Watch().stream(
            self._core.list_node,
            resource_version=resource_version,
            timeout_seconds=timeout,
            deserialize=False,  # plain dicts: no model classes for every heartbeat
        )
        for event in stream:
            obj = event.get("object") or {}  # deserialize=False: the JSON line as it came
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
                yield str(event["type"]), KubeNode.from_object(obj)


# --- the loop ---------------------------------------------------------------------------------


class SyncJournal:
    """Append-only JSON lines, one per action, flushed to disk before the next."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, entry: Mapping[str, Any]) -> None:
        with self.path.open("a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


@dataclass
class CordonSync:
    """The watch loop: list, reconcile, watch (debounced reconcile per burst), relist."""

    nodes: NodeSource
    slurm: Slurm
    journal: SyncJournal
    ignore: Sequence[str] = DEFAULT_IGNORED_TAINTS
    resync_seconds: int = 300
    debounce_seconds: float = 0.05
    clock: Callable[[], float] = time.time
    last_error: str | None = None  # the cause while the loop cannot list, watch or reach Slurm
    listed_at: float | None = None  # when the last full list was reconciled
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def reconcile(self, nodes: Iterable[KubeNode], seen_at: float) -> list[Action]:
        """One pass over `nodes` against Slurm now; drains and resumes batched per reason."""
        actions = plan(nodes, self.slurm.nodes(), self.ignore)
        by_kind: dict[tuple[str, str], list[Action]] = {}
        for a in actions:
            by_kind.setdefault((a.verb, a.reason if a.verb == "drain" else ""), []).append(a)
        for (verb, reason), group in sorted(by_kind.items()):
            names = [a.node for a in group]
            if verb == "drain":
                self.slurm.drain(names, reason)
            else:
                self.slurm.resume(names)
            done = self.clock()
            for a in group:
                log.info("cordon sync: %s %s (%s)", verb, a.node, a.cause)
                self.journal.record(
                    {
                        "ts": done,
                        "node": a.node,
                        "action": verb,
                        "reason": a.reason,
                        "cause": a.cause,
                        "seconds": round(done - seen_at, 3),
                    }
                )
        return actions

    def run_once(self) -> None:
        """List, reconcile, then watch until the resync time; reconcile after each burst."""
        listed, rv = self.nodes.list()
        cache = {n.name: n for n in listed}
        self.reconcile(cache.values(), self.clock())
        self.last_error, self.listed_at = None, self.clock()
        for kind, node in self.nodes.watch(rv, self.resync_seconds):
            if self._stop.is_set():
                return
            if kind == "DELETED":
                cache.pop(node.name, None)
                continue
            if cache.get(node.name) == node:
                continue  # a heartbeat (status): nothing the sync reads has changed
            cache[node.name] = node
            seen = self.clock()
            # a cordon is a patch and then the node controller's mirror taint: let it settle
            time.sleep(self.debounce_seconds)
            self.reconcile([cache[node.name]], seen)

    def _loop(self) -> None:
        # 1 s doubling to 30 s while the API server or slurmctld is broken, reset by a good pass;
        # the wait is on the stop event, so stop() ends it at once
        retry = Backoff(base=1.0, cap=30.0, jitter=0.0, stop=self._stop)
        while not self._stop.is_set():
            try:
                self.run_once()
                retry.succeeded()
            except Exception as exc:  # the loop outlives a broken API server or slurmctld
                self.last_error = f"{type(exc).__name__}: {exc}"
                pause = retry.failed()
                log.warning("cordon sync: %s (retrying in %.0f s)", self.last_error, pause)
                retry.wait(pause)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cordon-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()  # the watch ends at its timeout at the latest; the thread is a daemon

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
