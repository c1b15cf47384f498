#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurmd_pods
short_description: Find the slurmd pods on an old pod template, or restart one node's
description:
  - The slurmd DaemonSets (one per GPU pool) use the C(OnDelete) update strategy, so a pod template
    change (a new config hash after a pool or slurm.conf change, a new image) reaches a node only
    when its pod is deleted. This module reads which pods are behind.
  - A pod is B(stale) when its C(controller-revision-hash) label is not the hash of its DaemonSet's
    newest ControllerRevision (the revision the DaemonSet controller creates new pods from).
  - With O(state=read), returns every slurmd pod by Kubernetes node (= Slurm node) name.
  - With O(state=restarted), evicts the stale pod on O(node) (Eviction API) and waits until a pod
    of the newest revision on that node is Ready (slurmd's readiness probe - slurmctld knows the
    node). A node whose pod is current is left alone (not changed). It drains nothing in Slurm -
    the role C(slurm_rollout) drains the node and waits for its jobs first.
version_added: 0.3.0
author: autoheal maintainers (@autoheal-project)
options:
  state:
    description: C(read) reads; C(restarted) restarts O(node)'s pod when it is stale.
    type: str
    choices: [read, restarted]
    default: read
  namespace:
    description: The namespace of the slurmd DaemonSets.
    type: str
    default: slurm
  selector:
    description: Label selector of the slurmd DaemonSets and their pods.
    type: str
    default: app.kubernetes.io/component=slurmd
  node:
    description: With O(state=restarted), the node whose pod to restart.
    type: str
  wait_seconds:
    description: With O(state=restarted), how long to wait for the new pod to be Ready.
    type: int
    default: 300
notes:
  - Check mode reports the restart it would do and evicts nothing.
  - Needs, in O(namespace), C(list) on pods and on C(apps) controllerrevisions, and C(create) on
    C(pods/eviction).
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Which slurmd pods run an old template?
  autoheal.cluster.slurmd_pods:
    kubeconfig: "{{ autoheal_kubeconfig }}"
  register: slurmd

- name: Restart gpu-3's slurmd (drain it in Slurm first)
  autoheal.cluster.slurmd_pods:
    state: restarted
    node: gpu-3
    kubeconfig: "{{ autoheal_kubeconfig }}"
"""

RETURN = r"""
pods:
  description: Per node - pod, daemonset, revision, current (the newest revision), stale, ready.
  returned: always
  type: dict
  sample:
    gpu-1: {pod: slurmd-h100-x7k2p, daemonset: slurmd-h100, revision: 5d8f, current: 7b4c, stale: true}
stale_nodes:
  description: The nodes whose slurmd pod is on an old revision, sorted.
  returned: always
  type: list
  elements: str
restarted:
  description: With O(state=restarted), the new pod's record (absent in check mode).
  returned: when a pod was restarted
  type: dict
"""

import time
from typing import Any
from urllib.parse import quote

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
    Obj,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes

REVISION_LABEL = "controller-revision-hash"  # Kubernetes' own, on DaemonSet pods and revisions
POLL_S = 2.0


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        state=dict(type="str", choices=["read", "restarted"], default="read"),
        namespace=dict(type="str", default="slurm"),
        selector=dict(type="str", default="app.kubernetes.io/component=slurmd"),
        node=dict(type="str"),
        wait_seconds=dict(type="int", default=300),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def newest_revisions(revisions: list[Obj]) -> dict[str, str]:
    """DaemonSet uid -> the revision hash of its newest ControllerRevision."""
    best: dict[str, tuple[int, str]] = {}
    for rev in revisions:
        meta = rev.get("metadata") or {}
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"), None)
        label = (meta.get("labels") or {}).get(REVISION_LABEL)
        if owner is None or label is None:
            continue
        number = int(rev.get("revision") or 0)
        if owner["uid"] not in best or number > best[owner["uid"]][0]:
            best[owner["uid"]] = (number, label)
    return {uid: label for uid, (_n, label) in best.items()}


def _ready(pod: Obj) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def pod_records(pods: list[Obj], current: dict[str, str]) -> dict[str, dict[str, Any]]:
    """node -> its slurmd pod's record (pods being deleted and unscheduled ones left out)."""
    out: dict[str, dict[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "DaemonSet"), None)
        if meta.get("deletionTimestamp") or not node or owner is None:
            continue
        revision = (meta.get("labels") or {}).get(REVISION_LABEL, "")
        newest = current.get(owner["uid"], revision)
        out[node] = dict(
            pod=meta.get("name"),
            daemonset=owner.get("name"),
            revision=revision,
            current=newest,
            stale=revision != newest,
            ready=_ready(pod),
        )
    return out


def read(kube: Kube, namespace: str, selector: str) -> dict[str, dict[str, Any]]:
    base = "/apis/apps/v1/namespaces/" + quote(namespace, safe="")
    query = {"labelSelector": selector}
    revisions = kube.request("GET", base + "/controllerrevisions", query=query).get("items") or []
    pods = (
        kube.request("GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", query=query).get("items")
        or []
    )
    return pod_records(list(pods), newest_revisions(list(revisions)))


def restart(module: Any, kube: Kube, record: dict[str, Any], node: str) -> dict[str, Any]:
    """Evict the node's pod (the Eviction API: the rights the runbook's drain already has, and a
    PodDisruptionBudget is honoured); wait for a Ready pod of the newest revision on the node."""
    p = module.params
    ns, name = p["namespace"], record["pod"]
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns}}
    try:
        kube.request(
            "POST", f"/api/v1/namespaces/{quote(ns, safe='')}/pods/{quote(name, safe='')}/eviction", body
        )
    except KubeError as exc:
        if exc.status != 404:  # already gone: its successor is what we wait for
            module.fail_json(msg=f"evicting pod {ns}/{name} on {node} failed: {exc}")
    deadline = time.monotonic() + p["wait_seconds"]
    seen: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        seen = read(kube, p["namespace"], p["selector"]).get(node)
        if seen and seen["pod"] != record["pod"] and not seen["stale"] and seen["ready"]:
            return seen
        time.sleep(POLL_S)
    module.fail_json(
        msg=(
            f"the new slurmd pod on {node} was not Ready within wait_seconds={p['wait_seconds']}"
            f" (last seen: {seen}); its node stays drained in Slurm: look at the pod, then rerun"
        ),
        node=node,
    )
    return {}


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        required_if=[("state", "restarted", ["node"])],
        supports_check_mode=True,
    )
    p = module.params
    kube = Kube(module)
    try:
        pods = read(kube, p["namespace"], p["selector"])
    except KubeError as exc:
        module.fail_json(msg=f"listing the slurmd pods in namespace {p['namespace']} failed: {exc}")
    result: dict[str, Any] = dict(
        changed=False, pods=pods, stale_nodes=sorted(n for n, r in pods.items() if r["stale"])
    )
    if p["state"] == "restarted":
        node = validate_nodes(module, [p["node"]], "node")[0]
        record = pods.get(node)
        if record is None:
            module.fail_json(msg=f"node {node} runs no slurmd pod (selector {p['selector']})", **result)
            return
        if record["stale"]:
            result["changed"] = True
            if not module.check_mode:
                result["restarted"] = restart(module, kube, record, node)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
