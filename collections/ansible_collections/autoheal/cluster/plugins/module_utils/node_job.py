# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The parts of autoheal.cluster.node_job that need no cluster: a Job's name and manifest, the
checks of its inputs, and what a Job and its pod say about how the command went.

A Job's name is deterministic (a rerun for the same node and incident finds it) and fits the 63
characters a Job name may have (its pods carry it as a label value) for any node name: the
node's first DNS label, cut to fit, then a hash of node and incident. The whole node name and the
incident id ride along as annotations; the node as a label value only where it is one."""

from __future__ import annotations

import hashlib
import re
from typing import Any, Dict

from ansible_collections.autoheal.cluster.plugins.module_utils.contract import (
    INCIDENT_ANNOTATION,
    JOB_KEY_LABEL,
    JOB_NODE_LABEL,
    JOB_PURPOSE_LABEL,
    NODE_ANNOTATION,
)

Obj = Dict[str, Any]

PURPOSES = ("reset", "diag", "evidence")
MAX_NAME = 63  # a Job's name is its pods' job-name label value
HASH_LEN = 10
GPU_RESOURCE = "nvidia.com/gpu"
MANAGED_BY = ("app.kubernetes.io/managed-by", "autoheal")
NO_INCIDENT = "manual"
# registry/repository (lower case, optional :port) @ sha256 digest; no tag beside the digest
DIGEST_RE = re.compile(
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*@sha256:[0-9a-f]{64}"
)
LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
NAMESPACE_RE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
# a failed Job is kept this long for a human to read (`keep: false`); a Job that worked is deleted
FAILED_TTL_S = 7 * 24 * 3600
REASON_CHARS = 300


def job_key(node: str, incident: str) -> str:
    return hashlib.sha256(f"{node}\n{incident}".encode()).hexdigest()[:HASH_LEN]


def job_name(purpose: str, node: str, incident: str) -> str:
    """autoheal-<purpose>-<the node's first DNS label, cut>-<hash of node and incident>."""
    prefix = f"autoheal-{purpose}-"
    room = MAX_NAME - len(prefix) - 1 - HASH_LEN
    short = re.sub(r"[^a-z0-9-]", "-", node.split(".")[0].lower())[:room].strip("-") or "node"
    return f"{prefix}{short}-{job_key(node, incident)}"


def node_label(node: str) -> str:
    """The node as a label value: itself when it is one (63 characters at most), else cut + hash."""
    if len(node) <= MAX_NAME and LABEL_VALUE_RE.fullmatch(node):
        return node
    cut = node[: MAX_NAME - HASH_LEN - 1].rstrip("-._")
    return f"{cut}-{hashlib.sha256(node.encode()).hexdigest()[:HASH_LEN]}"


def image_problem(image: object) -> str | None:
    """Why `image` is refused (None: a reference by digest)."""
    if not isinstance(image, str) or not image:
        return "image: empty; give the image by digest (registry/name@sha256:<64 hex>)"
    if not DIGEST_RE.fullmatch(image):
        return (
            f"image: {image[:120]!r} is not a reference by digest; a tag can move under a running "
            "fleet and the stack's digest policy refuses it. Pin it: registry/name@sha256:<64 hex> "
            "(e.g. `crane digest <image>`; for the ladder set monitoring.dcgmImage or ladder_dcgm_image)"
        )
    return None


def gpus_problem(gpus: object) -> str | None:
    if gpus == "all" or (isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 0):
        return None
    if isinstance(gpus, str) and gpus.isdigit():
        return None
    return f"gpus: {str(gpus)[:40]!r} is neither a count (0 or more) nor 'all'"


def one_line(text: object, limit: int = REASON_CHARS) -> str:
    return " ".join(str(text or "").split())[:limit]


def job_manifest(p: Obj, name: str, node: str, incident: str, gpus: int) -> Obj:
    """The Job: one pod, never retried, pinned to `node` by name through the scheduler (so a
    GPU it cannot have leaves it Pending with the scheduler's reason), tolerating every taint (the
    node is cordoned and quarantined), no API token, killed at `timeout`."""
    labels = {
        MANAGED_BY[0]: MANAGED_BY[1],
        JOB_PURPOSE_LABEL: p["purpose"],
        JOB_NODE_LABEL: node_label(node),
        JOB_KEY_LABEL: job_key(node, incident),
    }
    meta = {"labels": labels, "annotations": {NODE_ANNOTATION: node, INCIDENT_ANNOTATION: incident}}
    container: Obj = {
        "name": p["purpose"],
        "image": p["image"],
        "command": [str(c) for c in p["command"]],
        "env": [
            {"name": "AUTOHEAL_NODE", "value": node},
            {"name": "AUTOHEAL_INCIDENT", "value": incident},
            {"name": "AUTOHEAL_PURPOSE", "value": p["purpose"]},
        ],
        # a failed command's last output lines become the pod's termination message
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"privileged": True} if p["privileged"] else {"allowPrivilegeEscalation": False},
    }
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}}
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    pod: Obj = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 10,
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        },
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if p.get("service_account"):
        pod["serviceAccountName"] = p["service_account"]
    spec: Obj = {
        "backoffLimit": 0,
        "activeDeadlineSeconds": int(p["timeout"]),
        "template": {"metadata": meta, "spec": pod},
    }
    if not p["keep"]:
        spec["ttlSecondsAfterFinished"] = FAILED_TTL_S
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": p["namespace"], **meta},
        "spec": spec,
    }


def _true_conditions(obj: Obj) -> dict[str, Obj]:
    conds = (obj.get("status") or {}).get("conditions") or []
    return {str(c.get("type")): c for c in conds if c.get("status") == "True"}


def newest_pod(pods: list[Obj]) -> Obj | None:
    return max(
        pods, key=lambda x: str((x.get("metadata") or {}).get("creationTimestamp") or ""), default=None
    )


def terminated(pod: Obj | None) -> Obj | None:
    """The first container's terminated state (this run's, else the last one's)."""
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        for key in ("state", "lastState"):
            term = (cs.get(key) or {}).get("terminated")
            if term:
                return dict(term)
    return None


def _failure(job: Obj, cond: Obj, pod: Obj | None, timeout: int) -> tuple[int | None, str]:
    """(exit code, one-line reason) of a Job that failed."""
    term = terminated(pod)
    code = int(term["exitCode"]) if term and term.get("exitCode") is not None else None
    if cond.get("reason") == "DeadlineExceeded":
        # a pod still there and Pending never ran (a pod gone tells nothing: the controller removes it)
        if (
            term is None
            and pod is not None
            and ((pod.get("status") or {}).get("phase") or "Pending") == "Pending"
        ):
            return None, one_line(f"DeadlineExceeded: never started within {timeout} s: {pending_why(pod)}")
        return code, f"DeadlineExceeded: not finished within {timeout} s (the Job was stopped)"
    if term is not None:
        lines = [ln for ln in str(term.get("message") or "").splitlines() if ln.strip()]
        last = lines[-1] if lines else str(term.get("reason") or "")
        return code, one_line(f"Failed exit {code}: {last}" if last else f"Failed exit {code}")
    status = (pod or {}).get("status") or {}
    if status.get("reason"):  # refused by the kubelet (e.g. OutOfnvidia.com/gpu)
        return None, one_line(f"Failed: {status.get('reason')}: {status.get('message') or ''}")
    return None, one_line(f"Failed: {cond.get('reason') or ''} {cond.get('message') or ''}")


def pending_why(pod: Obj | None) -> str:
    """Why a pod has not started: the scheduler's message, else the container's waiting reason."""
    if pod is None:
        return "the Job created no pod (see `kubectl describe job`: quota, admission, namespace)"
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return one_line(c.get("message") or c.get("reason") or "not scheduled")
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return one_line(f"{waiting.get('reason') or 'Waiting'}: {waiting.get('message') or ''}")
    return "not started"


def outcome(job: Obj, pods: list[Obj], timeout: int) -> Obj | None:
    """{ok, exit_code, reason, pod} once the Job has finished; None while it runs or waits."""
    conds = _true_conditions(job)
    pod = newest_pod(pods)
    name = ((pod or {}).get("metadata") or {}).get("name")
    if "Complete" in conds:
        return dict(ok=True, exit_code=0, reason="Completed", pod=name)
    if "Failed" in conds:
        code, why = _failure(job, conds["Failed"], pod, timeout)
        return dict(ok=False, exit_code=code, reason=why, pod=name)
    return None


def is_pending(pods: list[Obj]) -> bool:
    """No pod yet, or the newest one not started (unscheduled, pulling, waiting)."""
    pod = newest_pod(pods)
    if pod is None:
        return True
    return ((pod.get("status") or {}).get("phase") or "Pending") == "Pending"


def api_reason(status: int, message: object) -> str:
    """An API error as a one-line reason: Forbidden: ..., NotFound: ..., API error 500: ..."""
    names = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid"}
    head = names.get(status) or f"API error {status}"
    return one_line(f"{head}: {message}")


def node_gpus(node: Obj) -> int:
    """The GPUs a node has (capacity, healthy or not): `gpus: all` asks for every one of them, so a
    GPU the device plugin marked unhealthy leaves the pod unschedulable instead of untested."""
    status = node.get("status") or {}
    raw = (status.get("capacity") or {}).get(GPU_RESOURCE) or "0"
    try:
        return int(str(raw))
    except ValueError:
        return 0
