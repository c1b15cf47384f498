# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The batch form of the evidence module, from the ladder's readings: one entry per node with its
incident, the sources the health check named (kernel log, metrics endpoint, GPUs), the failures
of its last validation and, on a real node, its evidence Job (autoheal.cluster.node_job).
Documented in evidence_nodes.yml; tested in tests/runbook/test_ladder_filters.py and
tests/runbook/test_evidence_sources.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def evidence_nodes(
    nodes: Iterable[str],
    incidents: Mapping[str, str] | None = None,
    sources: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] | None = None,
    failed: Mapping[str, Any] | None = None,
    jobs: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The O(nodes) of autoheal.cluster.evidence. `sources`: one reading per node, parallel to
    `nodes` (health_result of batch_results) or {node: reading}; a node without one has none.
    `failed`: {node: why} of the last validation. `jobs`: the registered result of the evidence
    Jobs (node_job), or None when none were to run (no `report` then)."""
    names = [str(n) for n in nodes or []]
    if isinstance(sources, Mapping):
        by_node = {n: sources.get(n) for n in names}
    else:
        got = list(sources or [])
        by_node = {n: got[i] if i < len(got) else None for i, n in enumerate(names)}
    out = []
    for n in names:
        reading = by_node[n]
        src: Mapping[str, Any] = reading if isinstance(reading, Mapping) else {}
        gpus = src.get("gpus")
        why = (failed or {}).get(n)
        out.append(
            dict(
                node=n,
                incident_id=str((incidents or {}).get(n) or "manual"),
                kmsg=str(src.get("kmsg") or ""),
                metrics_url=str(src.get("metrics_url") or ""),
                gpus=[dict(g) for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else [],
                validation={"failures": why} if why not in (None, "", [], {}) else {},
            )
        )
        if jobs is not None:
            out[-1]["report"] = job_report(jobs, n)
    return out


def job_report(jobs: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The node's entry of node_job's node_results, or a failed one saying why there is none (the
    task was skipped, or the module failed before it had node_results)."""
    results = jobs.get("node_results") if isinstance(jobs, Mapping) else None
    got = results.get(node) if isinstance(results, Mapping) else None
    if isinstance(got, Mapping):
        return dict(got)
    if not isinstance(jobs, Mapping) or jobs.get("skipped"):
        why = "the evidence Job was not started"
    else:
        why = str(jobs.get("msg") or "node_job returned no result for this node")[:300]
    return {"ok": False, "exit_code": None, "reason": why, "logs": "", "job": ""}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"evidence_nodes": evidence_nodes}
