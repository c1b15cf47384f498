#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
  - A second run finds nothing left to evict and reports no change.
version_added: 0.1.0
author: autoheal maintainers
extends_documentation_fragment:
  - autoheal.cluster.kube
options:
  nodes:
    description: Node names.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds for the whole batch (evictions refused by a PDB are retried until then, and evicted pods waited for).
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
attributes:
  check_mode:
    support: full
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
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import validate_nodes

MIRROR = "kubernetes.io/config.mirror"


def classify(pod, p):
    """Return (action, reason): action in evict/ignore/block."""
    meta = pod.get("metadata") or {}
    if MIRROR in (meta.get("annotations") or {}):
        return "ignore", "mirror pod"
    if meta.get("deletionTimestamp"):
        return "wait", "terminating"
    owners = meta.get("ownerReferences") or []
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        return "evict", ""
    if any(o.get("kind") == "DaemonSet" for o in owners):
        return "ignore", "DaemonSet pod"
    if not owners and not p["force"]:
        return "block", "not managed by a controller (use force)"
    vols = (pod.get("spec") or {}).get("volumes") or []
    if any("emptyDir" in v for v in vols) and not p["delete_emptydir_data"]:
        return "block", "uses emptyDir (use delete_emptydir_data)"
    return "evict", ""


def main():
    argument_spec = dict(
        nodes=dict(type="list", elements="str", required=True),
        timeout=dict(type="float", default=120),
        grace_period=dict(type="int"),
        force=dict(type="bool", default=False),
        delete_emptydir_data=dict(type="bool", default=True),
        poll=dict(type="float", default=1),
    )
    argument_spec.update(KUBE_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    names = validate_nodes(module, p["nodes"])
    kube = Kube(module)
    deadline = time.time() + p["timeout"]

    def evict(pod):
        meta = pod["metadata"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        if p["grace_period"] is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": p["grace_period"]}
        kube.request("POST", "/api/v1/namespaces/%s/pods/%s/eviction" % (meta["namespace"], meta["name"]), body)

    def drain(name):
        if kube.get_node(name) is None:
            return dict(missing=True)
        out = dict(evicted=[], not_evicted=[], ignored=[])
        refused = {}  # pod key -> last refusal message
        issued = set()
        while True:
            pods = kube.pods_on(name)
            pending = []
            for pod in pods:
                meta = pod["metadata"]
                key = "%s/%s" % (meta["namespace"], meta["name"])
                action, why = classify(pod, p)
                if action == "ignore":
                    if key not in out["ignored"]:
                        out["ignored"].append(key)
                    continue
                if action == "block":
                    if not any(x["pod"] == key for x in out["not_evicted"]):
                        out["not_evicted"].append(dict(pod=key, reason=why))
                    continue
                pending.append((key, pod, action))
            if module.check_mode:
                out["evicted"] = [k for k, _pod, a in pending if a == "evict"]
                return out
            todo = [(k, pod) for k, pod, a in pending if a == "evict" and k not in issued]
            for key, pod in todo:
                try:
                    evict(pod)
                    issued.add(key)
                    out["evicted"].append(key)
                    refused.pop(key, None)
                except KubeError as exc:
                    if exc.status == 404:
                        continue
                    if exc.status == 429:  # a PodDisruptionBudget says not now: retry until the deadline
                        refused[key] = exc.message
                        continue
                    raise
            if not pending or time.time() >= deadline:
                break
            time.sleep(p["poll"])
        for key, _pod, _a in pending:
            reason = refused.get(key) or "still terminating at the timeout"
            out["not_evicted"].append(dict(pod=key, reason="%s" % reason))
        return out

    res = kube.map(drain, names)
    result = dict(changed=False, evicted={}, not_evicted={}, ignored={}, drained_nodes=[], missing_nodes=[],
                  errors={})
    for name in names:
        out, err = res[name]
        if err:
            result["errors"][name] = err
            continue
        if out.get("missing"):
            result["missing_nodes"].append(name)
            continue
        if out["evicted"]:
            result["evicted"][name] = out["evicted"]
            result["changed"] = True
        if out["ignored"]:
            result["ignored"][name] = out["ignored"]
        if out["not_evicted"]:
            result["not_evicted"][name] = out["not_evicted"]
        else:
            result["drained_nodes"].append(name)
    if result["errors"]:
        module.fail_json(msg="Kubernetes API errors: %s" % result["errors"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
