#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_job
short_description: Run a command as a Kubernetes Job pinned to each node of a batch, and report how it went
description:
  - For each node, one Job (one pod, never retried) runs O(command) in O(image) on that node, with
    O(gpus) GPUs allocated to it through the scheduler and every taint tolerated (the node is
    cordoned and quarantined). The Jobs of the batch run side by side; the module waits for all.
  - It reports the truth per node in RV(node_results) - C(ok) only for a pod that ran and exited 0. A Job
    that failed (with its exit code and last output line), ran past O(timeout), stayed Pending past
    O(pending_timeout) (with the scheduler's or the kubelet's reason), or could not be created or
    read (an API error such as 403 Forbidden) is a failed node naming the cause, never a module
    failure and never a pass. (C(results) and C(failed) are Ansible's own keys, hence
    RV(node_results) and RV(failed_nodes).) Jobs stopped for a timeout are deleted, so they cannot run later.
  - Job names are deterministic - C(autoheal-<purpose>-<node's first DNS label, cut>-<hash of node
    and incident>), at most 63 characters for any node name; the node and incident are annotations
    (C(autoheal.io/node), C(autoheal.io/incident)). A rerun for the same node and incident finds
    the Job and reads its result instead of starting another. A Job that worked is deleted unless
    O(keep); a failed one is kept for a week for a human to read (with O(keep), forever).
  - Check mode creates and deletes nothing; it reports an existing Job's state, or that one would
    be created.
  - The pod gets no API token and the environment C(AUTOHEAL_NODE), C(AUTOHEAL_INCIDENT) and
    C(AUTOHEAL_PURPOSE).
version_added: 0.3.0
author: autoheal maintainers (@autoheal-project)
options:
  namespace:
    description: Namespace of the Jobs (the runner's own, where its Role allows Jobs).
    type: str
    default: autoheal
  purpose:
    description: What the Job does; part of its name and the label C(autoheal.io/job-purpose).
    type: str
    required: true
    choices: [reset, diag, evidence]
  incidents:
    description: "C({node: incident id}); a node not listed runs for the incident C(manual)."
    type: dict
    default: {}
  image:
    description:
      - The image, by digest (C(registry/name@sha256:<64 hex>)). A tag is refused - it can move
        under a running fleet, and the stack's digest policy refuses it everywhere else.
    type: str
    required: true
  command:
    description: The command and its arguments (an argv, no shell).
    type: list
    elements: str
    required: true
  gpus:
    description:
      - C(nvidia.com/gpu) to allocate to the pod - a count, or C(all) for every GPU the node has
        (its capacity, so a GPU the device plugin marked unhealthy cannot be allocated and the
        pod stays Pending - a failed node - rather than passing without it).
    type: raw
    default: 0
  privileged:
    description: Run the container privileged (a GPU reset needs it).
    type: bool
    default: false
  timeout:
    description: Seconds the Job may take in all (its C(activeDeadlineSeconds)); then it is a failed node.
    type: int
    default: 600
  pending_timeout:
    description:
      - Seconds the pod may stay Pending (unscheduled, image not pulled, waiting) from this run's
        start; then the Job is deleted and the node failed with the reason it waited.
    type: int
    default: 120
  service_account:
    description: ServiceAccount of the pod (its token is not mounted); the namespace's default when omitted.
    type: str
  keep:
    description:
      - Keep finished Jobs. By default a Job that worked is deleted, a failed one expires after a week.
    type: bool
    default: false
  log_bytes:
    description: How much of the end of the pod's log RV(node_results) carries per node.
    type: int
    default: 8192
  poll:
    description: Seconds between reads of a Job at first; the pause grows to 15 s while it runs.
    type: float
    default: 2
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.no_diff
  - autoheal.cluster.nodes
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Reset the GPUs of the batch
  autoheal.cluster.node_job:
    nodes: "{{ nodes }}"
    purpose: reset
    incidents: "{{ incidents }}"
    image: registry.example.com/dcgm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
    command: [nvidia-smi, --gpu-reset]
    privileged: true
    timeout: 120
  register: reset
  # reset.node_results['gpu-3'] == {ok: false, exit_code: 3, reason: "Failed exit 3: GPU 0 is busy", ...}
"""

RETURN = r"""
node_results:
  description:
    - Per node - C(ok) (bool), C(exit_code) (int or null), C(reason) (one line), C(logs) (the
      log's end), C(job) (its name).
  returned: always
  type: dict
  sample:
    gpu-3:
      ok: false
      exit_code: null
      reason: "Pending 120 s: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu"
      logs: ""
      job: autoheal-diag-gpu-3-1a2b3c4d5e
ok_nodes:
  description: The nodes whose command ran and exited 0.
  returned: always
  type: list
  elements: str
failed_nodes:
  description: "C({node: reason}) for the others (not C(failed): that key would fail the task)."
  returned: always
  type: dict
api_retries:
  description: Requests sent again because the API server did not answer (see O(api_wait)).
  returned: always
  type: int
"""

import time
from typing import Any
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.backoff import Backoff
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
    Obj,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.node_job import (
    NAMESPACE_RE,
    NO_INCIDENT,
    PURPOSES,
    api_reason,
    gpus_problem,
    image_problem,
    is_pending,
    job_manifest,
    job_name,
    newest_pod,
    node_gpus,
    outcome,
    pending_why,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import (
    is_incident_id,
    shown,
    validate_nodes,
)

POLL_CAP_S = 15.0
# the Job controller stops a Job at activeDeadlineSeconds; this long after it, the module stops it
GRACE_S = 60


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        namespace=dict(type="str", default="autoheal"),
        purpose=dict(type="str", required=True, choices=list(PURPOSES)),
        incidents=dict(type="dict", default={}),
        image=dict(type="str", required=True),
        command=dict(type="list", elements="str", required=True),
        gpus=dict(type="raw", default=0),
        privileged=dict(type="bool", default=False),
        timeout=dict(type="int", default=600),
        pending_timeout=dict(type="int", default=120),
        service_account=dict(type="str"),
        keep=dict(type="bool", default=False),
        log_bytes=dict(type="int", default=8192),
        poll=dict(type="float", default=2),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def check_params(module: Any) -> list[str]:
    """Fail the task, naming the option, on anything that is not right; return the nodes."""
    p = module.params
    nodes = validate_nodes(module, p["nodes"])
    for problem in (image_problem(p["image"]), gpus_problem(p["gpus"])):
        if problem:
            module.fail_json(msg=problem)
    if not NAMESPACE_RE.fullmatch(p["namespace"] or ""):
        module.fail_json(msg=f"namespace: {p['namespace']!r} is not a namespace name (DNS label)")
    if not p["command"] or any(not c for c in p["command"]):
        module.fail_json(msg="command: give the command and its arguments as a non-empty list of strings")
    bad = [i for n, i in (p["incidents"] or {}).items() if n in nodes and not is_incident_id(i)]
    if bad:
        module.fail_json(msg=f"incidents: invalid incident id(s): {shown(bad)}")
    for key in ("timeout", "pending_timeout", "log_bytes"):
        if p[key] < 1:
            module.fail_json(msg=f"{key}: must be at least 1 (got {p[key]})")
    if p["gpus"] != "all":
        p["gpus"] = int(p["gpus"])
    return nodes


class NodeJob:
    """One node's Job: found or created, waited for, read, and deleted when done with."""

    def __init__(self, module: Any, kube: Kube, node: str, started: float) -> None:
        self.module, self.kube, self.node, self.started = module, kube, node, started
        self.p: dict[str, Any] = module.params
        self.incident = str((self.p["incidents"] or {}).get(node) or NO_INCIDENT)
        self.name = job_name(self.p["purpose"], node, self.incident)
        ns = quote(self.p["namespace"])
        self.path = f"/apis/batch/v1/namespaces/{ns}/jobs"
        self.pods_path = f"/api/v1/namespaces/{ns}/pods"
        self.changed = False

    def run(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(ok=False, exit_code=None, reason="", logs="", job=self.name)
        try:
            out.update(self._run())
        except KubeError as exc:
            out["reason"] = api_reason(exc.status, exc.message)
        return out

    def _get(self) -> Obj | None:
        try:
            return self.kube.request("GET", f"{self.path}/{self.name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def _pods(self) -> list[Obj]:
        out = self.kube.request("GET", self.pods_path, query={"labelSelector": f"job-name={self.name}"})
        return list(out.get("items") or [])

    def _delete(self) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        try:
            self.kube.request("DELETE", f"{self.path}/{self.name}", body)
        except KubeError as exc:
            if exc.status != 404:
                raise
        self.changed = True

    def _gpus(self) -> int | str:
        """The GPU count to ask for, or why there is none to ask for."""
        if self.p["gpus"] != "all":
            return int(self.p["gpus"])
        node = self.kube.get_node(self.node)
        if node is None:
            return f"NotFound: node {self.node} does not exist"
        count = node_gpus(node)
        return (
            count if count > 0 else f"node {self.node} has no nvidia.com/gpu (is its device plugin running?)"
        )

    def _start(self) -> dict[str, Any] | None:
        """Create the Job unless it exists; a result when there is nothing to wait for."""
        if self._get() is not None:
            return None
        gpus = self._gpus()
        if isinstance(gpus, str):
            return dict(reason=gpus)
        if self.module.check_mode:
            self.changed = True
            return dict(reason=f"check mode: Job {self.name} would be created")
        try:
            self.kube.request(
                "POST", self.path, job_manifest(self.p, self.name, self.node, self.incident, gpus)
            )
            self.changed = True
        except KubeError as exc:
            if exc.status != 409:  # 409: created meanwhile (a request sent twice, a rerun): read it
                raise
        return None

    def _run(self) -> dict[str, Any]:
        early = self._start()
        if early is not None:
            return early
        res = self._wait()
        pod = res.pop("pod", None)
        if pod:
            res["logs"] = self._logs(pod)
        if res.get("ok") and not self.p["keep"] and not self.module.check_mode:
            self._delete()
        return res

    def _wait(self) -> dict[str, Any]:
        timeout, pending = self.p["timeout"], self.p["pending_timeout"]
        pause = Backoff(self.p["poll"], max(self.p["poll"], POLL_CAP_S), jitter=0.2)
        while True:
            job = self._get()
            if job is None:
                return dict(reason=f"the Job {self.name} was deleted before it finished (by someone else)")
            pods = self._pods()
            done = outcome(job, pods, timeout)
            if done is not None:
                return done
            age = time.monotonic() - self.started
            if self.module.check_mode:
                return dict(reason=f"check mode: Job {self.name} has not finished")
            if is_pending(pods) and age > pending:
                self._delete()
                return dict(reason=f"Pending {int(age)} s: {pending_why(newest_pod(pods))}")
            if age > timeout + GRACE_S:
                self._delete()
                return dict(
                    reason=f"timed out: no result after {int(age)} s (timeout {timeout} s), Job deleted"
                )
            pause.wait(pause.failed())

    def _logs(self, pod: str) -> str:
        try:
            text = self.kube.text(
                f"{self.pods_path}/{quote(pod)}/log",
                query={"container": self.p["purpose"], "limitBytes": self.p["log_bytes"] * 2},
            )
        except KubeError as exc:
            return f"(no log: {api_reason(exc.status, exc.message)})"
        return text[-self.p["log_bytes"] :]


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    nodes = check_params(module)
    kube = Kube(module)
    started = time.monotonic()
    jobs = {n: NodeJob(module, kube, n, started) for n in nodes}
    ran = kube.map(lambda n: jobs[n].run(), nodes)
    results: dict[str, Any] = {}
    for node in nodes:  # a bug in one node's thread is that node's failure, not a lost node
        res, err = ran[node]
        results[node] = res or dict(
            ok=False, exit_code=None, reason=f"error: {err}", logs="", job=jobs[node].name
        )
    ok = [n for n in nodes if results[n]["ok"]]
    module.exit_json(
        changed=any(j.changed for j in jobs.values()),
        node_results=results,
        ok_nodes=ok,
        failed_nodes={n: results[n]["reason"] for n in nodes if n not in ok},
        api_retries=kube.api_retries,
    )


if __name__ == "__main__":
    main()
