"""Per GPU pool, three rows: its nodes (size + spares of them, Ready), their labels and taints
(the pool's labels; no taint its slurmd pods do not tolerate), and the GPUs they advertise; a
fourth for a Guaranteed pool: room on each node for slurmd's request."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from autoheal import labels as lb
from components.config import PoolSpec, StackSpec, TaintSpec
from components.preflight.model import Check, ClusterView
from components.preflight.objects import (
    blocking_taints,
    gpus_of,
    is_ready,
    labels_of,
    listed,
    name_of,
    quantity,
)

# A DaemonSet's pods tolerate these by themselves (the node lifecycle's own taints).
_DAEMONSET_TOLERATED = (
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/network-unavailable",
)

Node = dict[str, Any]


def check_pool_nodes(cfg: StackSpec, view: ClusterView) -> list[Check]:
    """Per pool: its nodes exist (size + spares of them), carry its labels and no taint its slurmd
    pods do not tolerate, and advertise its GPUs."""
    out: list[Check] = []
    for index, pool in enumerate(cfg.pools):
        members = _pool_members(pool, view)
        out.append(_nodes_check(pool, members))
        if members:  # without nodes, the other rows would only say so again
            out.append(_labels_taints_check(pool, index, members))
            out.append(_gpus_check(pool, members))
            if cfg.guaranteed(pool):
                out.append(_room_check(pool, members))
    return out


def _pool_members(pool: PoolSpec, view: ClusterView) -> list[Node]:
    """The pool's nodes: those labelled autoheal.io/pool=<its name>, Ready or not."""
    return [n for n in view.nodes if labels_of(n).get(lb.POOL_LABEL) == pool.name]


def _nodes_check(pool: PoolSpec, members: list[Node]) -> Check:
    row = f"pool {pool.name}: nodes"
    selector = f"{lb.POOL_LABEL}={pool.name}"
    want = pool.size + pool.spares
    wanted = f"size {pool.size} + spares {pool.spares} = {want}"
    label_cmd = f"kubectl label node <node> {selector}"
    if not members:
        return Check(
            row,
            "fail",
            f"no node is labelled {selector} (the pool wants {wanted})",
            f"label the pool's GPU nodes: {label_cmd}",
        )
    ready = [n for n in members if is_ready(n)]
    not_ready = sorted({name_of(n) for n in members} - {name_of(n) for n in ready})
    late = f"; not Ready: {listed(not_ready)}" if not_ready else ""
    if len(ready) < pool.size:
        return Check(
            row,
            "fail",
            f"{len(ready)} Ready nodes labelled {selector}, fewer than the pool's size ({wanted}){late}",
            f"add {want - len(ready)} nodes ({label_cmd}) or lower size in Pulumi.<stack>.yaml",
        )
    if len(ready) < want:
        return Check(
            row,
            "warn",
            f"{len(ready)} Ready nodes labelled {selector}: {want - len(ready)} short of {wanted}, "
            f"so fewer hot spares than declared{late}",
            f"add {want - len(ready)} nodes ({label_cmd}) or lower spares",
        )
    if len(members) > want:
        return Check(
            row,
            "warn",
            f"{len(members)} nodes labelled {selector}, more than {wanted}: every one runs slurmd{late}",
            "raise size/spares to match, or take the label off the extra nodes",
        )
    return Check(row, "pass", f"{len(ready)} Ready nodes labelled {selector} ({wanted})")


def _missing_labels(pool: PoolSpec, members: list[Node]) -> dict[str, list[str]]:
    """key=value of the pool's labels -> the nodes without it."""
    missing: dict[str, list[str]] = {}
    for node in members:
        have = labels_of(node)
        for key, value in pool.labels.items():
            if have.get(key) != value:
                missing.setdefault(f"{key}={value}", []).append(name_of(node))
    return missing


def _untolerated_taints(pool: PoolSpec, members: list[Node]) -> dict[str, list[str]]:
    """A taint slurmd does not tolerate -> the nodes carrying it. The node lifecycle's taints,
    the spare taint and the fence's quarantine taint are autoheal's own business, not a problem."""
    tolerated = [*pool.taints, TaintSpec(**lb.spare_taint())]  # type: ignore[arg-type]
    tainted: dict[str, list[str]] = {}
    for node in members:
        taints = [
            t
            for t in node.get("spec", {}).get("taints") or []
            if t.get("key") not in _DAEMONSET_TOLERATED and t.get("key") != lb.QUARANTINE_TAINT_KEY
        ]
        for text in blocking_taints(taints, tolerated):
            tainted.setdefault(text, []).append(name_of(node))
    return tainted


def _labels_taints_check(pool: PoolSpec, index: int, members: list[Node]) -> Check:
    row = f"pool {pool.name}: labels, taints"
    missing = _missing_labels(pool, members)
    tainted = _untolerated_taints(pool, members)
    problems = [f"{label} missing on {listed(nodes)}" for label, nodes in sorted(missing.items())]
    problems += [
        f"{listed(nodes)} tainted {taint}, which slurmd does not tolerate"
        for taint, nodes in sorted(tainted.items())
    ]
    if not problems:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(pool.labels.items())) or "no labels declared"
        return Check(row, "pass", f"{shown}; taints tolerated")
    fixes = []
    if missing:
        fixes.append("kubectl label node <node> " + " ".join(sorted(missing)))
    if tainted:
        fixes.append(f"add the taint to autoheal:pools[{index}].taints, or remove it from the nodes")
    return Check(row, "fail", "; ".join(problems), "; ".join(fixes))


def _gpus_check(pool: PoolSpec, members: list[Node]) -> Check:
    row = f"pool {pool.name}: GPUs"
    gpus = {name_of(n): gpus_of(n) for n in members}
    none = sorted(n for n, g in gpus.items() if g == 0)
    few = sorted(f"{n} ({g})" for n, g in gpus.items() if 0 < g < pool.gpus_per_node)
    if len(none) == len(members):
        return Check(
            row,
            "fail",
            f"no node of pool {pool.name} advertises {lb.GPU_RESOURCE}",
            "install the NVIDIA device plugin or GPU Operator (it advertises the GPUs to Kubernetes)",
        )
    if not none and not few:
        return Check(row, "pass", f"every node advertises at least {pool.gpus_per_node} {lb.GPU_RESOURCE}")
    problems = []
    if none:
        problems.append(
            f"{listed(none)} advertise no {lb.GPU_RESOURCE} (the device plugin is not running there)"
        )
    if few:
        problems.append(f"{listed(few)} advertise fewer than gpusPerNode {pool.gpus_per_node}")
    return Check(
        row,
        "fail",
        "; ".join(problems),
        "check the device plugin's pods on those nodes (and the GPUs: nvidia-smi), "
        "or set gpusPerNode to what each node has",
    )


def _room_check(pool: PoolSpec, members: list[Node]) -> Check:
    """A Guaranteed slurmd asks for the CPUs and memory Slurm is told the node has, plus its munge
    sidecar: a node whose allocatable is smaller never runs it."""
    row = f"pool {pool.name}: room for slurmd"
    cpu, memory = slurmd_request(pool)
    short = []
    for node in members:
        alloc = node.get("status", {}).get("allocatable") or {}
        have_cpu, have_memory = quantity(alloc.get("cpu", 0)), quantity(alloc.get("memory", 0))
        if have_cpu < cpu or have_memory < memory:
            short.append(f"{name_of(node)} ({have_cpu} CPUs, {have_memory / 2**20:.0f}Mi)")
    asked = f"{cpu} CPUs and {memory / 2**20:.0f}Mi (cpus, realMemoryMb and the munge sidecar)"
    if not short:
        return Check(row, "pass", f"every node's allocatable fits slurmd's {asked}")
    return Check(
        row,
        "fail",
        f"slurmd is Guaranteed and asks for {asked}; allocatable is less on {listed(sorted(short))}",
        "lower the pool's cpus / realMemoryMb to what the nodes' allocatable holds beside their "
        "DaemonSets, or set guaranteed: false",
    )


def slurmd_request(pool: PoolSpec) -> tuple[Decimal, Decimal]:
    """(CPUs, bytes) a Guaranteed slurmd pod of `pool` requests: slurmd and its munge sidecar."""
    from components.slurm.workers import MUNGE_RESOURCES  # loads Pulumi: only when asked

    cpu = Decimal(pool.cpus) + quantity(MUNGE_RESOURCES["cpu"])
    memory = Decimal(pool.real_memory_mb) * 2**20 + quantity(MUNGE_RESOURCES["memory"])
    return cpu, memory
