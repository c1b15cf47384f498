#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
author: autoheal maintainers
extends_documentation_fragment:
  - autoheal.cluster.kube
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
attributes:
  check_mode:
    support: full
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    node_ready,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import validate_nodes


def summarize(node, pods, label, value):
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    rec = dict(
        exists=True,
        labels=labels,
        annotations=meta.get("annotations") or {},
        taints=(node.get("spec") or {}).get("taints") or [],
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        ready=node_ready(node),
        pods=[],
        opt_out=False,
        opt_out_sources=[],
    )
    if labels.get(label) == value:
        rec["opt_out_sources"].append("node label %s=%s" % (label, value))
    for pod in pods or []:
        pm = pod.get("metadata") or {}
        owners = pm.get("ownerReferences") or []
        phase = (pod.get("status") or {}).get("phase")
        rec["pods"].append(dict(namespace=pm.get("namespace"), name=pm.get("name"), phase=phase,
                                owner_kind=owners[0].get("kind") if owners else None))
        if (pm.get("labels") or {}).get(label) == value and phase not in ("Succeeded", "Failed"):
            rec["opt_out_sources"].append("pod %s/%s" % (pm.get("namespace"), pm.get("name")))
    rec["opt_out"] = bool(rec["opt_out_sources"])
    return rec


def main():
    argument_spec = dict(
        nodes=dict(type="list", elements="str", default=[]),
        selector=dict(type="str"),
        with_pods=dict(type="bool", default=True),
        opt_out_label=dict(type="str", default="autoheal.io/opt-out"),
        opt_out_value=dict(type="str", default="true"),
    )
    argument_spec.update(KUBE_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    names = validate_nodes(module, p["nodes"])
    kube = Kube(module)

    def read(name):
        node = kube.get_node(name)
        if node is None:
            return None
        pods = kube.pods_on(name) if p["with_pods"] else []
        return summarize(node, pods, p["opt_out_label"], p["opt_out_value"])

    res = kube.map(read, names)
    result = dict(changed=False, nodes={}, missing_nodes=[], opt_out_nodes={}, errors={})
    for name in names:
        rec, err = res[name]
        if err:
            result["errors"][name] = err
        elif rec is None:
            result["missing_nodes"].append(name)
            result["nodes"][name] = dict(exists=False)
        else:
            result["nodes"][name] = rec
            if rec["opt_out"]:
                result["opt_out_nodes"][name] = rec["opt_out_sources"]
    if p["selector"]:
        try:
            listed = kube.request("GET", "/api/v1/nodes", query={"labelSelector": p["selector"]})
        except Exception as exc:
            module.fail_json(msg="listing nodes failed: %s" % exc, **result)
        result["selected"] = {}
        for node in listed.get("items") or []:
            name = node["metadata"]["name"]
            result["selected"][name] = summarize(node, [], p["opt_out_label"], p["opt_out_value"])
    if result["errors"]:
        module.fail_json(msg="Kubernetes API errors: %s" % result["errors"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
