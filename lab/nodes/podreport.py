"""Why pods are not Ready, in a few lines: pod, container, its state and its last log lines.

The Pulumi Kubernetes provider's rollout error names the pod and the unready containers
("[Pod slurmctld-0]: containers with unready status: [slurmctld]") but not why; `lab.stack`
appends this report to a failed `pulumi up`, so the cause (a missing file, a refused key) is in the
error rather than behind a `kubectl logs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from lab import controlplane

LOG_LINES = 5


def _state(status: dict[str, Any]) -> str:
    state = status.get("state") or {}
    last = (status.get("lastState") or {}).get("terminated")
    before = (
        f"; restarted {status.get('restartCount', 0)}x, last exit {last.get('exitCode', '?')}" if last else ""
    )
    if "waiting" in state:
        w = state["waiting"]
        return f"waiting: {w.get('reason', '?')}{before}"
    if "terminated" in state:
        t = state["terminated"]
        return f"exited {t.get('exitCode', '?')} ({t.get('reason', '?')})"
    return f"running, not ready{before}"


def _logs(http: httpx.Client, ns: str, pod: str, container: str, previous: bool) -> list[str]:
    params: dict[str, str | int] = {"container": container, "tailLines": LOG_LINES}
    if previous:
        params["previous"] = "true"
    r = http.get(f"/api/v1/namespaces/{ns}/pods/{pod}/log", params=params)
    return r.text.strip().splitlines()[-LOG_LINES:] if r.status_code == 200 else []


def _unready_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [
        c
        for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        if not c.get("ready") and (c.get("state") or {}).get("terminated", {}).get("exitCode") != 0
    ]


def _describe(http: httpx.Client, pod: dict[str, Any]) -> list[str]:
    meta = pod["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    unready = _unready_containers(pod)
    lines: list[str] = []
    if not unready:
        reason = ((pod.get("status") or {}).get("conditions") or [{}])[0].get("message", "")
        lines.append(f"pod {where}: {(pod.get('status') or {}).get('phase', '?')} {reason}".rstrip())
    for c in unready:
        lines.append(f"pod {where} container {c['name']}: {_state(c)}")
        # A container waiting out its crash back-off: its last run is the kubelet's "current" one
        # (asking for `previous` then names the run before, which the kubelet has already
        # removed: every such request failed for 90 s in CI). A restarted one now running: the
        # run that crashed is `previous`. Either way the other is tried when the first fails.
        previous = "running" in (c.get("state") or {}) and bool((c.get("lastState") or {}).get("terminated"))
        ns, name = meta["namespace"], meta["name"]
        logs = _logs(http, ns, name, c["name"], previous) or _logs(http, ns, name, c["name"], not previous)
        lines += [f"    {line}" for line in logs]
    return lines


def describe(kubeconfig: Path, pod: dict[str, Any]) -> str:
    """Why one pod is not Ready: its unready containers' states and last log lines."""
    with controlplane.http_client(kubeconfig, pool=1) as http:
        return "\n".join(_describe(http, pod))


def report(kubeconfig: Path, namespaces: list[str] | None = None) -> str:
    """One block per unready container of every pod not Ready (in `namespaces`, or all)."""
    lines: list[str] = []
    with controlplane.http_client(kubeconfig, pool=1) as http:
        pods = http.get("/api/v1/pods").json().get("items", [])
        for pod in pods:
            meta = pod["metadata"]
            if namespaces and meta["namespace"] not in namespaces:
                continue
            conds = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
            if conds.get("Ready") == "True" or (pod.get("status") or {}).get("phase") == "Succeeded":
                continue
            lines += _describe(http, pod)
    return "\n".join(lines)
