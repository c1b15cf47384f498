#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_evict
short_description: Drain many Kubernetes nodes concurrently through the Eviction API (PDB-aware)
description:
  - The batch counterpart of M(kubernetes.core.k8s_drain) - that module takes one node per call and
    refuses C(async), so a batch of 50 nodes would drain one node after the other. This module
    drains every node of the batch at once from one process.
  - For each node it lists the pods bound to it and evicts them with the Eviction API
    (C(policy/v1)). An eviction a PodDisruptionBudget refuses (HTTP 429) is retried until
    O(timeout); pods still refused then are reported in RV(not_evicted), never deleted behind the
    budget's back.
  - Mirror pods and DaemonSet pods are left (DaemonSet pods tolerate the node's taints anyway);
    pods without a controller are only evicted with O(force); pods with emptyDir volumes only with
    O(delete_emptydir_data). Those left are reported with the reason.
  - It does not cordon - quarantine the nodes first (M(autoheal.cluster.k8s_nodes)).
  - Each pod evicted is reported with its workload and its owner's contact (RV(evicted_owners)) so the
    runbook can tell the owners of a service it moved (an inference Deployment on a lent node) - from the pod
    alone, no other read - the workload from its controller reference (a ReplicaSet named
    C(<deployment>-<pod-template-hash>) is its Deployment's), the contact from the pod's annotation
    C(autoheal.io/owner-contact), which a workload sets in its pod template.
  - A second run finds nothing left to evict and reports no change.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  timeout:
    description:
      - Seconds for the whole batch (evictions refused by a PDB are retried until then, and evicted
        pods waited for).
    type: float
    default: 120
  grace_period:
    description: Pod termination grace period passed to the eviction; the pod's own when omitted.
    type: int
  force:
    description: Also evict pods without a controller.
    type: bool
    default: false
  delete_emptydir_data:
    description: Also evict pods using emptyDir volumes.
    type: bool
    default: true
  poll:
    description: Seconds between retries and checks.
    type: float
    default: 1
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.no_diff
  - autoheal.cluster.nodes
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Drain the quarantined nodes concurrently
  autoheal.cluster.k8s_evict:
    nodes: "{{ autoheal_nodes }}"
    timeout: 120
  register: drain
  # drain.not_evicted == {gpu-3: [{pod: team-a/trainer-0, reason: "PodDisruptionBudget ..."}]}
"""

RETURN = r"""
evicted:
  description: Pods evicted (would be, in check mode), per node.
  returned: always
  type: dict
  sample: {gpu-3: [default/side-7d9-abcde]}
evicted_owners:
  description:
    - Per node, each pod of RV(evicted) with its workload (C(kind), C(namespace), C(name) - a
      ReplicaSet's Deployment, a bare pod's C(Pod)) and C(contact) (the pod's
      C(autoheal.io/owner-contact) annotation, empty when it has none).
  returned: always
  type: dict
  sample:
    gpu-3:
      - {pod: web/infer-7d9f8-abcde, namespace: web, kind: Deployment, name: infer, contact: "slack:#serving"}
not_evicted:
  description: Pods left on the nodes, per node, with the reason (PDB, no controller, emptyDir, timeout).
  returned: always
  type: dict
drained_nodes:
  description: Nodes with nothing evictable left.
  returned: always
  type: list
  elements: str
ignored:
  description: DaemonSet and mirror pods left on purpose, per node.
  returned: always
  type: dict
missing_nodes:
  description: Nodes that do not exist.
  returned: always
  type: list
  elements: str
api_retries:
  description: Requests sent again because the API server did not answer (see O(api_wait)).
  returned: always
  type: int
"""

import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import OWNER_CONTACT_ANNOTATION
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
    Obj,
    sort_results,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes

MIRROR = "kubernetes.io/config.mirror"
TEMPLATE_HASH = "pod-template-hash"  # the Deployment controller names its ReplicaSets <name>-<hash>


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        timeout=dict(type="float", default=120),
        grace_period=dict(type="int"),
        force=dict(type="bool", default=False),
        delete_emptydir_data=dict(type="bool", default=True),
        poll=dict(type="float", default=1),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def classify(pod: Obj, p: dict[str, Any]) -> tuple[str, str]:
    """Return (action, reason): action in evict/ignore/block/wait."""
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    vols = (pod.get("spec") or {}).get("volumes") or []
    if MIRROR in (meta.get("annotations") or {}):
        return "ignore", "mirror pod"
    if meta.get("deletionTimestamp"):
        return "wait", "terminating"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "evict", ""
    if any(o.get("kind") == "DaemonSet" for o in owners):
        return "ignore", "DaemonSet pod"
    if not owners and not p["force"]:
        return "block", "not managed by a controller (use force)"
    if any("emptyDir" in v for v in vols) and not p["delete_emptydir_data"]:
        return "block", "uses emptyDir (use delete_emptydir_data)"
    return "evict", ""


def owner_record(pod: Obj) -> dict[str, str]:
    """The pod, its workload and its owner's contact, read from the pod alone (the runbook's
    identity reads pods, not workloads): the controller reference, a ReplicaSet named
    <name>-<pod-template-hash> read as the Deployment <name>; the contact from the annotation its
    workload's pod template gives it."""
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    kind, workload = ("Pod", name) if ref is None else (str(ref.get("kind")), str(ref.get("name")))
    suffix = "-" + str((meta.get("labels") or {}).get(TEMPLATE_HASH) or "")
    if kind == "ReplicaSet" and len(suffix) > 1 and workload.endswith(suffix):
        kind, workload = "Deployment", workload[: -len(suffix)]
    contact = str((meta.get("annotations") or {}).get(OWNER_CONTACT_ANNOTATION) or "")
    return dict(pod=f"{ns}/{name}", namespace=ns, kind=kind, name=workload, contact=contact[:200])


class Drain:
    """The eviction of one node's pods, retried until the deadline (a PDB may say not now)."""

    def __init__(self, module: Any, kube: Kube, name: str, deadline: float) -> None:
        self.module, self.kube, self.name, self.deadline = module, kube, name, deadline
        self.p: dict[str, Any] = module.params
        self.out: dict[str, list[Any]] = dict(evicted=[], not_evicted=[], ignored=[], evicted_owners=[])
        self.refused: dict[str, str] = {}  # pod key -> the last refusal
        self.issued: set[str] = set()

    def evict(self, pod: Obj) -> None:
        meta = pod["metadata"]
        body: Obj = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        }
        if self.p["grace_period"] is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": self.p["grace_period"]}
        self.kube.request(
            "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction", body
        )

    def pending(self) -> list[tuple[str, Obj, str]]:
        """The pods still to go (key, pod, action); ignored and blocked pods are recorded."""
        todo = []
        for pod in self.kube.pods_on(self.name):
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            action, why = classify(pod, self.p)
            if action == "ignore" and key not in self.out["ignored"]:
                self.out["ignored"].append(key)
            elif action == "block" and not any(x["pod"] == key for x in self.out["not_evicted"]):
                self.out["not_evicted"].append(dict(pod=key, reason=why))
            elif action in ("evict", "wait"):
                todo.append((key, pod, action))
        return todo

    def issue(self, key: str, pod: Obj) -> None:
        try:
            self.evict(pod)
        except KubeError as exc:
            if exc.status == 429:  # a PodDisruptionBudget says not now: retry until the deadline
                self.refused[key] = str(exc.message)
            elif exc.status != 404:
                raise
            return
        self.issued.add(key)
        self.out["evicted"].append(key)
        self.out["evicted_owners"].append(owner_record(pod))
        self.refused.pop(key, None)

    def run(self) -> dict[str, list[Any]] | None:
        if self.kube.get_node(self.name) is None:
            return None
        while True:
            pending = self.pending()
            if self.module.check_mode:
                self.out["evicted"] = [k for k, _pod, a in pending if a == "evict"]
                self.out["evicted_owners"] = [owner_record(pod) for _k, pod, a in pending if a == "evict"]
                return self.out
            for key, pod, action in pending:
                if action == "evict" and key not in self.issued:
                    self.issue(key, pod)
            if not pending or time.time() >= self.deadline:
                break
            time.sleep(self.p["poll"])
        for key, _pod, _a in pending:
            self.out["not_evicted"].append(
                dict(pod=key, reason=self.refused.get(key) or "still terminating at the timeout")
            )
        return self.out


def build_result(names: list[str], res: dict[str, Any]) -> dict[str, Any]:
    found, missing, errors = sort_results(names, res)
    result: dict[str, Any] = dict(
        changed=False,
        evicted={},
        evicted_owners={},
        not_evicted={},
        ignored={},
        drained_nodes=[],
        missing_nodes=missing,
        errors=errors,
    )
    for name, out in found.items():
        for key in ("evicted", "evicted_owners", "ignored", "not_evicted"):
            if out[key]:
                result[key][name] = out[key]
        if not out["not_evicted"]:
            result["drained_nodes"].append(name)
    result["changed"] = bool(result["evicted"])
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    names = validate_nodes(module, module.params["nodes"])
    kube = Kube(module)
    deadline = time.time() + module.params["timeout"]
    result = build_result(names, kube.map(lambda n: Drain(module, kube, n, deadline).run(), names))
    result["api_retries"] = kube.api_retries
    if result["errors"]:
        module.fail_json(msg=f"Kubernetes API errors: {result['errors']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
