#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k8s_nodes_info
short_description: Read many Kubernetes nodes, the pods on them and their opt-out labels, concurrently
description:
  - For each node (requests run concurrently from this one process) returns its labels,
    annotations, taints, C(unschedulable), readiness and the pods bound to it.
  - A node is opted out of automatic remediation when the node B(or a pod running on it) carries
    the label O(opt_out_label)=O(opt_out_value); RV(opt_out_nodes) lists them with the sources.
  - With O(selector), also lists the nodes matching a label selector (e.g. the spares of a pool).
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  nodes:
    description: Node names to read.
    type: list
    elements: str
    default: []
  selector:
    description: Also list nodes matching this label selector (returned in RV(selected)).
    type: str
  with_pods:
    description: List the pods on each node (needed for the pod opt-out check).
    type: bool
    default: true
  opt_out_label:
    description: Label key that opts a node or pod out.
    type: str
    default: autoheal.io/opt-out
  opt_out_value:
    description: Label value that opts out.
    type: str
    default: "true"
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.info
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Preflight - do the nodes exist, and is any of them (or a pod on it) opted out?
  autoheal.cluster.k8s_nodes_info:
    nodes: "{{ autoheal_nodes }}"
    kubeconfig: "{{ autoheal_kubeconfig }}"
  register: k8s_pre
"""

RETURN = r"""
nodes:
  description: Per node - exists, labels, annotations, taints, unschedulable, ready, pods, opt_out.
  returned: always
  type: dict
missing_nodes:
  description: Nodes that do not exist in Kubernetes.
  returned: always
  type: list
  elements: str
opt_out_nodes:
  description: Nodes opted out, with why (C(node label) or C(pod ns/name)).
  returned: always
  type: dict
  sample: {gpu-3: ["pod team-a/trainer-0"]}
selected:
  description: Names of the nodes matching O(selector), with the same per-node record.
  returned: when selector is given
  type: dict
errors:
  description: Per node API errors.
  returned: always
  type: dict
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import OPT_OUT_LABEL
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
    Obj,
    node_ready,
    sort_results,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", default=[]),
        selector=dict(type="str"),
        with_pods=dict(type="bool", default=True),
        opt_out_label=dict(type="str", default=OPT_OUT_LABEL),
        opt_out_value=dict(type="str", default="true"),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def pod_record(pod: Obj) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    owners = meta.get("ownerReferences") or []
    return dict(
        namespace=meta.get("namespace"),
        name=meta.get("name"),
        phase=(pod.get("status") or {}).get("phase"),
        owner_kind=owners[0].get("kind") if owners else None,
        labels=meta.get("labels") or {},
    )


def summarize(node: Obj, pods: list[Obj], label: str, value: str) -> dict[str, Any]:
    """The node's record; it is opted out when it, or a live pod on it, carries label=value."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    labels = meta.get("labels") or {}
    records = [pod_record(p) for p in pods or []]
    sources = [f"node label {label}={value}"] if labels.get(label) == value else []
    sources += [
        f"pod {r['namespace']}/{r['name']}"
        for r in records
        if r["labels"].get(label) == value and r["phase"] not in ("Succeeded", "Failed")
    ]
    return dict(
        exists=True,
        labels=labels,
        annotations=meta.get("annotations") or {},
        taints=spec.get("taints") or [],
        unschedulable=bool(spec.get("unschedulable")),
        ready=node_ready(node),
        pods=[{k: v for k, v in r.items() if k != "labels"} for r in records],
        opt_out=bool(sources),
        opt_out_sources=sources,
    )


def read_nodes(kube: Kube, names: list[str], p: dict[str, Any]) -> dict[str, Any]:
    def read(name: str) -> dict[str, Any] | None:
        node = kube.get_node(name)
        if node is None:
            return None
        pods = kube.pods_on(name) if p["with_pods"] else []
        return summarize(node, pods, p["opt_out_label"], p["opt_out_value"])

    found, missing, errors = sort_results(names, kube.map(read, names))
    return dict(
        changed=False,
        nodes={n: found.get(n, dict(exists=False)) for n in names if n not in errors},
        missing_nodes=missing,
        opt_out_nodes={n: rec["opt_out_sources"] for n, rec in found.items() if rec["opt_out"]},
        errors=errors,
    )


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    kube = Kube(module)
    result = read_nodes(kube, validate_nodes(module, p["nodes"]), p)
    if p["selector"]:
        try:
            listed = kube.request("GET", "/api/v1/nodes", query={"labelSelector": p["selector"]})
        except KubeError as exc:
            module.fail_json(msg=f"listing nodes failed: {exc}", **result)
        result["selected"] = {
            node["metadata"]["name"]: summarize(node, [], p["opt_out_label"], p["opt_out_value"])
            for node in listed.get("items") or []
        }
    if result["errors"]:
        module.fail_json(msg=f"Kubernetes API errors: {result['errors']}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
