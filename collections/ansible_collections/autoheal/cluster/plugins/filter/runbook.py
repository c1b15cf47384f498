# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The runbooks' decisions, as filters: which Slurm reason each node gets, which nodes a step acts
on, what a drain left behind. They live here, tested (tests/runbook/test_filters.py), so that a
play reads as the list of its steps. Documented in the .yml file of the same name as each filter.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ansible_collections.autoheal.cluster.plugins.module_utils.contract import PROMOTION_PREFIX

Run = Mapping[str, Any]  # the fact autoheal_run (autoheal.cluster.runbook_inputs)


def node_map(nodes: Iterable[str], values: Iterable[Any] | None, default: Any = None) -> dict[str, Any]:
    """{node: value} from two parallel lists; nodes past the end of `values` get `default`."""
    vals = list(values or [])
    return {n: vals[i] if i < len(vals) else default for i, n in enumerate(nodes or [])}


def slurm_reasons(run: Run) -> dict[str, str]:
    """The Slurm reason of each node: the fault (``XID 79 gpu3``) or the manual reason, then the
    node's incident. A batch bigger than `reason_per_node_max` (a storm) shares one reason naming
    its first incident and the batch size, so the whole batch is fenced with ONE scontrol call;
    each node's own incident is still in its annotation, the journal and the Events."""
    nodes, incidents = list(run["nodes"]), run["incidents"]
    if run.get("xid") is not None:
        head = f"XID {run['xid']}" + (f" gpu{run['gpu']}" if run.get("gpu") is not None else "")
    else:
        head = str(run.get("reason") or "manual fence")
    limit = run.get("reason_per_node_max")
    if limit is None or len(nodes) <= int(limit):
        return {n: f"{head} {incidents[n]}" for n in nodes}
    shared = f"{head} {incidents[nodes[0]]} +{len(nodes) - 1}"
    return {n: shared for n in nodes}


def triage(fence: Mapping[str, Any], run: Run, opt_out: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Which nodes each later step acts on, from the fence's result and the preflight's opt-out
    verdicts ({node: [sources]}): nodes gone from everywhere are skipped; opted-out nodes (or all,
    with autoheal_opt_out) stay fenced and are only notified; the rest are remediated."""
    gone = [n for n in run["nodes"] if n in fence["gone_nodes"]]
    fenced = [n for n in run["nodes"] if n not in gone]
    if run.get("opt_out"):
        why = {n: "autoheal_opt_out" for n in fenced}
    else:
        why = {n: ", ".join(map(str, (opt_out or {})[n])) for n in fenced if n in (opt_out or {})}
    act = [n for n in fenced if n not in why]
    return dict(
        gone=gone,
        fenced=fenced,
        opt_out=[n for n in fenced if n in why],
        opt_out_why=why,
        act=act,
        act_slurm=[n for n in act if n in fence["slurm_nodes"]],
        act_kube=[n for n in act if n in fence["kube_nodes"]],
        kube=list(fence["kube_nodes"]),
    )


def nodes_where(nodes: Mapping[str, Mapping[str, Any]], **wanted: Any) -> list[str]:
    """Names of the node records (e.g. autoheal.cluster.slurm_node_info's `nodes`) whose fields
    all have the wanted values: ``info.nodes | autoheal.cluster.nodes_where(down=true, owned=true)``."""
    return [name for name, rec in nodes.items() if all(rec.get(k) == v for k, v in wanted.items())]


def promoted_for(
    nodes: Mapping[str, Mapping[str, Any]], returning: Iterable[str], prefix: str = PROMOTION_PREFIX
) -> list[str]:
    """The spares whose promotion record (the comment autoheal.cluster.slurm_spares writes,
    ``autoheal: replaces <node> <incident>``) names one of the `returning` nodes. A record stands
    while its node is out of service, so a new incident for that outage promotes no second spare;
    clearing it when the node returns lets a later failure take a new one."""
    wanted = set(returning or [])
    out = []
    for name, rec in nodes.items():
        comment = str(rec.get("comment") or "")
        if comment.startswith(prefix) and comment[len(prefix) :].split(" ", 1)[0] in wanted:
            out.append(name)
    return out


def annotate(values: Mapping[str, Any], key: str) -> dict[str, dict[str, str]]:
    """Per node annotations for autoheal.cluster.k8s_nodes: {node: value} -> {node: {key: value}};
    nodes without a value get none."""
    return {node: {key: str(value)} for node, value in values.items() if value not in (None, "")}


def k8s_drain_outcome(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a loop of kubernetes.core.k8s_drain tasks (one per node) drained, what it could not
    (node -> message) and its warnings, shaped like autoheal.cluster.k8s_evict's result."""
    ran = [r for r in results or [] if "skipped" not in r]
    return dict(
        drained=[r["item"] for r in ran if "result" in r],
        failures={r["item"]: r.get("msg", "drain failed") for r in ran if "result" not in r},
        warnings={r["item"]: r["warnings"] for r in ran if r.get("warnings")},
    )


def lab_pools(status: str | Mapping[str, Any]) -> dict[str, Any]:
    """`autoheal lab pool status --json` (its text or parsed): retired nodes, the members and
    pending nodes of every pool, and whether every pool is back at its declared size."""
    data = json.loads(status) if isinstance(status, str) else status
    pools = list((data.get("pools") or {}).values())
    members = [m for p in pools for m in p.get("members") or []]
    pending = [m for p in pools for m in p.get("pending") or []]
    return dict(
        retired=list(data.get("retired") or []),
        members=members,
        pending=pending,
        backfilled=not pending and len(members) >= sum(int(p.get("declared") or 0) for p in pools),
    )


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "node_map": node_map,
            "slurm_reasons": slurm_reasons,
            "triage": triage,
            "nodes_where": nodes_where,
            "promoted_for": promoted_for,
            "annotate": annotate,
            "k8s_drain_outcome": k8s_drain_outcome,
            "lab_pools": lab_pools,
        }
