# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Journal events from the results of the runbooks' steps, as filters, so that a play's journal
step is one line: ``autoheal_fence | autoheal.cluster.fence_events(autoheal_run.incidents)``.

An event is {incident, node, phase, status (ok|failed|skipped), ts, detail?}: the line the
runner reads back from the play's journal file (remediation/executor.py parse_event_line), and
the source of the Kubernetes Events the audit role creates (`kube_events`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import INCIDENT_ANNOTATION, LEND_LABEL

Event = dict[str, Any]
Detail = str | Mapping[str, Any] | None
MANAGED_BY = ("app.kubernetes.io/managed-by", "autoheal")  # marks the Events autoheal created
VERSION_LABEL = "app.kubernetes.io/version"  # the release that acted (issue 19)


@functools.lru_cache(maxsize=1)
def collection_version() -> str:
    """This collection's version: MANIFEST.json once installed, galaxy.yml in a checkout. The
    runner passes its own (`autoheal_version`, the same number); a play run by hand gets this."""
    root = Path(__file__).resolve().parents[2]
    try:
        if (root / "MANIFEST.json").exists():
            return str(json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"])
        return str(yaml.safe_load((root / "galaxy.yml").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return ""


def phase_events(
    nodes: Iterable[str],
    incidents: Mapping[str, str] | None,
    phase: str,
    status: str | Callable[[str], str] = "ok",
    ts: float | str | None = None,
    detail: Detail = None,
) -> list[Event]:
    """One event per node; `detail` is a text for all, or {node: text}."""
    stamp = float(ts) if ts not in (None, "") else time.time()
    out = []
    for n in nodes or []:
        d = detail.get(n) if isinstance(detail, Mapping) else detail
        ev: Event = dict(
            incident=str((incidents or {}).get(n) or "manual"),
            node=n,
            phase=phase,
            status=status(n) if callable(status) else status,
            ts=stamp,
        )
        if d not in (None, "", [], {}):
            ev["detail"] = d if isinstance(d, str) else str(d)
        out.append(ev)
    return out


def not_in_slurm(fence: Mapping[str, Any]) -> dict[str, str]:
    """{node: why} for the nodes Kubernetes knows and Slurm does not: a node lent to inference has
    no slurmd (its side named from LEND_LABEL), other ones never joined or already left."""
    if "slurm_nodes" not in fence:  # a slurm_node result: Slurm's side only
        return {}
    known = set(fence.get("slurm_nodes") or [])
    after = (fence.get("kube") or {}).get("nodes_after") or {}
    out = {}
    for n in fence.get("kube_nodes") or []:
        if n in known:
            continue
        side = ((after.get(n) or {}).get("labels") or {}).get(LEND_LABEL)
        out[n] = f"not in Slurm: lent to inference ({LEND_LABEL}={side})" if side else "not in Slurm"
    return out


def fence_events(fence: Mapping[str, Any], incidents: Mapping[str, str]) -> list[Event]:
    """`fenced` for every node that exists (naming an administrator's Slurm reason that was
    kept, or that Slurm has no record of it: a node lent to inference), `gone` for those known to
    neither Slurm nor Kubernetes. Takes the result of autoheal.cluster.fence, or of
    autoheal.cluster.slurm_node (then no node is gone)."""
    slurm = fence.get("slurm", fence)
    gone = list(fence.get("gone_nodes") or [])
    kept = {s["node"]: f"slurm reason kept: {s['reason']}" for s in slurm.get("skipped_nodes") or []}
    kept.update(not_in_slurm(fence))
    fenced = [n for n in incidents if n not in gone]
    at = fence.get("fenced_at")  # the module's own end: when the nodes were safe
    return phase_events(fenced, incidents, "fenced", "ok", ts=at, detail=kept) + phase_events(
        gone, incidents, "gone", "skipped", detail="unknown to Slurm and Kubernetes"
    )


def promotion_events(promotion: Mapping[str, Any], incidents: Mapping[str, str]) -> list[Event]:
    """`spare_promoted` per failed node from autoheal.cluster.slurm_spares, naming its spare; a node
    the pool had no spare left for gets `no_spare` (ok, naming its pool): running out of spares in
    a storm is capacity, not a failed remediation - the node is still fenced, evacuated, drained
    and retired, and its jobs wait in the queue for backfill (docs/runbook.md)."""
    spares = {p["node"]: p["spare"] for p in promotion.get("promotions") or [] if p.get("spare")}
    pools = {p["node"]: p.get("pool") or "" for p in promotion.get("promotions") or []}
    short = list(promotion.get("shortfall") or [])
    return phase_events(list(spares), incidents, "spare_promoted", "ok", detail=spares) + phase_events(
        short,
        incidents,
        "no_spare",
        "ok",
        detail={n: f"no spare: jobs wait for capacity (pool {pools.get(n) or '?'})" for n in short},
    )


def jobs_by_node(
    nodes: Iterable[str], jobs: Iterable[Mapping[str, Any]], ids: Iterable[Any] | None = None
) -> dict[str, list[int]]:
    """{node: [job ids]} for the jobs (slurm_jobs `jobs` records) that ran on each node; with
    `ids`, only those job ids count."""
    wanted = None if ids is None else {int(i) for i in ids}
    out: dict[str, list[int]] = {n: [] for n in nodes or []}
    for job in jobs or []:
        if wanted is None or int(job["job_id"]) in wanted:
            for n in job.get("nodes") or []:
                if n in out:
                    out[n].append(job["job_id"])
    return out


def _ids(values: Iterable[Any]) -> str:
    return ",".join(str(v) for v in values)


def evacuation_events(
    jobs: Mapping[str, Any], nodes: Iterable[str], incidents: Mapping[str, str]
) -> list[Event]:
    """`jobs_signalled` and `requeued` per node from autoheal.cluster.slurm_jobs (evacuate):
    which jobs got the signal, which were requeued, and `failed` when one could not be."""
    nodes = list(nodes)
    ran = jobs_by_node(nodes, jobs.get("jobs") or [])
    requeued = jobs_by_node(nodes, jobs.get("jobs") or [], jobs.get("requeued_job_ids") or [])
    lost = jobs_by_node(nodes, jobs.get("jobs") or [], [j["job_id"] for j in jobs.get("not_requeued") or []])
    out: list[Event] = []
    for n in nodes:
        signalled = f"jobs {_ids(ran[n])}" if ran[n] else "no jobs"
        detail = f"requeued {_ids(requeued[n]) or 'none'}" + (
            f" not requeued {_ids(lost[n])}" if lost[n] else ""
        )
        out += phase_events(
            [n], incidents, "jobs_signalled", "ok", ts=jobs.get("signalled_at"), detail=signalled
        )
        status = "failed" if lost[n] else "ok"
        out += phase_events([n], incidents, "requeued", status, ts=jobs.get("requeued_at"), detail=detail)
    return out


def evicted_text(owners: Iterable[Mapping[str, Any]]) -> str:
    """One line for the pods evicted from a node, each with its workload and its owner's contact
    (k8s_evict's `evicted_owners` records): "evicted web/infer-7d9-x (Deployment web/infer,
    owner email:serving@example.org)"."""
    parts = []
    for r in owners or []:
        who = f"{r.get('kind') or 'Pod'} {r.get('namespace')}/{r.get('name') or '?'}"
        contact = f", owner {r['contact']}" if r.get("contact") else ", no owner-contact"
        parts.append(f"{r.get('pod')} ({who}{contact})")
    return "evicted " + "; ".join(parts) if parts else ""


def drain_events(
    drained: Iterable[str],
    failures: Mapping[str, Any],
    incidents: Mapping[str, str],
    evicted: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
) -> list[Event]:
    """`drained` per node: ok (naming the pods evicted and their owners, with `evicted`:
    k8s_evict's `evicted_owners`), or failed with what could not be evicted."""
    said = {n: evicted_text(v) for n, v in (evicted or {}).items()}
    return phase_events(drained, incidents, "drained", "ok", detail=said) + phase_events(
        list(failures), incidents, "drained", "failed", detail=failures
    )


def retire_events(
    retired: Iterable[str], replacements: Iterable[str], incidents: Mapping[str, str]
) -> list[Event]:
    """`retired` per node, and `replacement_ready` once the backend reports new nodes."""
    retired, new = list(retired or []), list(replacements or [])
    ready = (
        phase_events(retired, incidents, "replacement_ready", "ok", detail="new " + ",".join(new))
        if new
        else []
    )
    return phase_events(retired, incidents, "retired", "ok") + ready


def escalation_events(nodes: Iterable[str], incidents: Mapping[str, str], task: str, msg: Any) -> list[Event]:
    """`escalated` (failed) for every node of a run that failed at `task`: a human takes over."""
    return phase_events(
        nodes, incidents, "escalated", "failed", detail=f"{task or '?'}: {str(msg or '')[:300]}"
    )


def _event_name(ev: Mapping[str, Any]) -> str:
    """Derived from (incident, node, phase): a rerun finds the Event and creates none."""
    digest = hashlib.sha1(
        f"{ev['incident']}/{ev['node']}/{ev['phase']}".encode(), usedforsecurity=False
    ).hexdigest()[:12]
    return f"{ev['node']}.autoheal-{digest}"


def kube_events(
    events: Iterable[Mapping[str, Any]],
    existing: Iterable[str],
    nodes: Iterable[str],
    namespace: str = "default",
    prefix: str = "autoheal",
    stamp: str | None = None,
    version: str = "",
) -> list[dict[str, Any]]:
    """Kubernetes Event objects on the nodes for the journal events that have none yet (by
    name); events of nodes not in `nodes` (absent from Kubernetes) are journaled only. Each
    carries the release that acted (`version`, else the collection's) as a label."""
    existing, nodes = set(existing or []), set(nodes or [])
    version = str(version or collection_version())
    labels = dict([MANAGED_BY, *([(VERSION_LABEL, version)] if version else [])])
    stamp = stamp or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = []
    for ev in events or []:
        name, status, detail = _event_name(ev), ev.get("status") or "ok", str(ev.get("detail") or "")
        if ev["node"] not in nodes or name in existing:
            continue
        message = f"{prefix}: {ev['phase']} {status} (incident {ev['incident']})" + (
            f": {detail}" if detail else ""
        )
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": {INCIDENT_ANNOTATION: str(ev["incident"])},
                },
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": ev["node"]},
                "reason": "Autoheal" + ev["phase"].replace("_", " ").title().replace(" ", ""),
                "message": message,
                "type": "Warning" if status == "failed" else "Normal",
                "source": {"component": "autoheal"},
                "reportingComponent": "autoheal",
                "reportingInstance": "autoheal-runner",
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
        )
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "phase_events": phase_events,
            "fence_events": fence_events,
            "promotion_events": promotion_events,
            "jobs_by_node": jobs_by_node,
            "evacuation_events": evacuation_events,
            "drain_events": drain_events,
            "retire_events": retire_events,
            "escalation_events": escalation_events,
            "kube_events": kube_events,
        }
