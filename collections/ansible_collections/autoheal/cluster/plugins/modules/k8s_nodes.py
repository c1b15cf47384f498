#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: k8s_nodes
short_description: Cordon, label, annotate and taint many Kubernetes nodes concurrently
description:
  - Brings each node to the wanted cordon state, labels, annotations and taints with one JSON merge
    patch per node, sent concurrently from this one process. Each patch carries the node's
    C(resourceVersion), so a concurrent writer makes it retry on fresh data instead of being
    overwritten.
  - Reports C(changed) only for nodes actually patched; a second run changes nothing.
  - Ownership of the cordon - when the module cordons a node it records the annotation
    O(cordon_owner_annotation); with O(cordon=false) it uncordons only nodes carrying that
    annotation (an administrator's cordon is left alone and reported in RV(skipped_nodes)), unless
    O(cordon_owned_only=false).
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
  cordon:
    description: C(true) cordons (unschedulable), C(false) uncordons; omitted leaves it alone.
    type: bool
  cordon_owned_only:
    description: With O(cordon=false), uncordon only nodes that this module cordoned.
    type: bool
    default: true
  cordon_owner_annotation:
    description: Annotation recording that autoheal cordoned the node.
    type: str
    default: autoheal.io/cordoned-by
  labels:
    description: Labels to set; a null value removes the label.
    type: dict
    default: {}
  annotations:
    description: Annotations to set on every node; a null value removes it.
    type: dict
    default: {}
  node_annotations:
    description: "Per node annotations, C({node: {key: value}}), applied after O(annotations)."
    type: dict
    default: {}
  taints:
    description: Taints to ensure present or absent.
    type: list
    elements: dict
    default: []
    suboptions:
      key:
        description: Taint key.
        type: str
        required: true
      value:
        description: Taint value (present only).
        type: str
      effect:
        description: Taint effect; with C(state=absent) and no effect, every effect of the key goes.
        type: str
        choices: [NoSchedule, PreferNoSchedule, NoExecute]
      state:
        description: Present or absent.
        type: str
        default: present
        choices: [present, absent]
  allow_missing:
    description: Do not fail on nodes that do not exist (they are reported).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Quarantine the failed nodes (cordon + taint + label), all at once
  autoheal.cluster.k8s_nodes:
    nodes: [gpu-3, gpu-4]
    cordon: true
    labels: {autoheal.io/state: quarantined}
    node_annotations: {gpu-3: {autoheal.io/incident: inc-42}, gpu-4: {autoheal.io/incident: inc-43}}
    taints:
      - {key: autoheal.io/quarantine, value: replace, effect: NoSchedule}

- name: Promote a spare
  autoheal.cluster.k8s_nodes:
    nodes: [gpu-5]
    labels: {autoheal.io/spare: null, autoheal.io/state: active}
    taints:
      - {key: autoheal.io/spare, state: absent}
"""

RETURN = r"""
changed_nodes:
  description: Nodes patched (would be, in check mode).
  returned: always
  type: list
  elements: str
unchanged_nodes:
  description: Nodes already as wanted.
  returned: always
  type: list
  elements: str
skipped_nodes:
  description: What was left alone and why (e.g. a cordon someone else set).
  returned: always
  type: list
  elements: dict
missing_nodes:
  description: Nodes that do not exist.
  returned: always
  type: list
  elements: str
nodes_after:
  description: Per node unschedulable, labels, annotations and taints after the patch.
  returned: always
  type: dict
errors:
  description: Per node API errors.
  returned: always
  type: dict
"""

import copy

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import (
    KUBE_COMMON_ARGS,
    Kube,
    KubeError,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import validate_nodes

OWNER = "autoheal"


def view(node):
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    return dict(unschedulable=bool(spec.get("unschedulable")), labels=dict(meta.get("labels") or {}),
                annotations=dict(meta.get("annotations") or {}), taints=list(spec.get("taints") or []))


def desired(cur, name, p):
    """Return (new view, skipped reasons) for one node."""
    new = copy.deepcopy(cur)
    skipped = []
    owner_key = p["cordon_owner_annotation"]
    for k, v in (p["labels"] or {}).items():
        if v is None:
            new["labels"].pop(k, None)
        else:
            new["labels"][k] = str(v)
    ann = dict(p["annotations"] or {})
    ann.update((p["node_annotations"] or {}).get(name) or {})
    for k, v in ann.items():
        if v is None:
            new["annotations"].pop(k, None)
        else:
            new["annotations"][k] = str(v)
    if p["cordon"] is True and not cur["unschedulable"]:
        new["unschedulable"] = True
        new["annotations"][owner_key] = OWNER
    elif p["cordon"] is False and cur["unschedulable"]:
        if cur["annotations"].get(owner_key) == OWNER or not p["cordon_owned_only"]:
            new["unschedulable"] = False
            new["annotations"].pop(owner_key, None)
        else:
            skipped.append(dict(node=name, what="uncordon", reason="cordoned by someone else"))
    taints = [t for t in new["taints"]]
    for t in p["taints"] or []:
        if t["state"] == "absent":
            taints = [x for x in taints if not (x.get("key") == t["key"]
                                                 and (not t.get("effect") or x.get("effect") == t["effect"]))]
        else:
            if not t.get("effect"):
                raise ValueError("taint %s: effect is required with state=present" % t["key"])
            want = dict(key=t["key"], effect=t["effect"])
            if t.get("value") is not None:
                want["value"] = t["value"]
            same = [x for x in taints if x.get("key") == t["key"] and x.get("effect") == t["effect"]]
            if not same or any(x.get("value") != want.get("value") for x in same):
                taints = [x for x in taints if not (x.get("key") == t["key"] and x.get("effect") == t["effect"])]
                taints.append(want)
    # Kubernetes adds timeAdded to NoExecute taints; compare without it.
    new["taints"] = taints
    return new, skipped


def strip(taints):
    return sorted((t.get("key"), t.get("value"), t.get("effect")) for t in taints)


def same(a, b):
    return (a["unschedulable"] == b["unschedulable"] and a["labels"] == b["labels"]
            and a["annotations"] == b["annotations"] and strip(a["taints"]) == strip(b["taints"]))


def merge_patch(cur, new, rv):
    meta = {"resourceVersion": rv}
    labels = dict((k, v) for k, v in new["labels"].items() if cur["labels"].get(k) != v)
    labels.update((k, None) for k in cur["labels"] if k not in new["labels"])
    anns = dict((k, v) for k, v in new["annotations"].items() if cur["annotations"].get(k) != v)
    anns.update((k, None) for k in cur["annotations"] if k not in new["annotations"])
    if labels:
        meta["labels"] = labels
    if anns:
        meta["annotations"] = anns
    spec = {}
    if new["unschedulable"] != cur["unschedulable"]:
        spec["unschedulable"] = new["unschedulable"] or None
    if strip(new["taints"]) != strip(cur["taints"]):
        spec["taints"] = new["taints"] or None
    body = {"metadata": meta}
    if spec:
        body["spec"] = spec
    return body


def main():
    argument_spec = dict(
        nodes=dict(type="list", elements="str", required=True),
        cordon=dict(type="bool"),
        cordon_owned_only=dict(type="bool", default=True),
        cordon_owner_annotation=dict(type="str", default="autoheal.io/cordoned-by"),
        labels=dict(type="dict", default={}),
        annotations=dict(type="dict", default={}),
        node_annotations=dict(type="dict", default={}),
        taints=dict(type="list", elements="dict", default=[], options=dict(
            key=dict(type="str", required=True, no_log=False),
            value=dict(type="str"),
            effect=dict(type="str", choices=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        )),
        allow_missing=dict(type="bool", default=False),
    )
    argument_spec.update(KUBE_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    names = validate_nodes(module, p["nodes"])
    kube = Kube(module)

    def handle(name):
        for attempt in range(6):
            # The first read comes from the watch cache and is trusted only for a patch, which
            # carries its resourceVersion; "missing" or "nothing to change" is read again.
            cached = attempt == 0
            node = kube.get_node(name, cached=cached)
            if node is None:
                if cached:
                    continue
                return dict(missing=True)
            cur = view(node)
            new, skipped = desired(cur, name, p)
            if same(cur, new):
                if cached:
                    continue
                return dict(changed=False, before=cur, after=cur, skipped=skipped)
            if module.check_mode:
                return dict(changed=True, before=cur, after=new, skipped=skipped)
            body = merge_patch(cur, new, node["metadata"].get("resourceVersion"))
            try:
                patched = kube.patch_node(name, body)
            except KubeError as exc:
                if exc.status == 409:  # someone else wrote the node meanwhile: recompute
                    continue
                raise
            return dict(changed=True, before=cur, after=view(patched), skipped=skipped)
        raise KubeError(409, "node %s kept changing under us (5 conflicts)" % name)

    res = kube.map(handle, names)
    result = dict(changed=False, changed_nodes=[], unchanged_nodes=[], skipped_nodes=[], missing_nodes=[],
                  nodes_after={}, errors={})
    diff_before, diff_after = {}, {}
    for name in names:
        out, err = res[name]
        if err:
            result["errors"][name] = err
            continue
        if out.get("missing"):
            result["missing_nodes"].append(name)
            continue
        result["skipped_nodes"].extend(out["skipped"])
        result["nodes_after"][name] = out["after"]
        if out["changed"]:
            result["changed"] = True
            result["changed_nodes"].append(name)
            diff_before[name] = out["before"]
            diff_after[name] = out["after"]
        else:
            result["unchanged_nodes"].append(name)
    if module._diff and result["changed"]:
        result["diff"] = dict(before=diff_before, after=diff_after)
    if result["errors"]:
        module.fail_json(msg="Kubernetes API errors: %s" % result["errors"], **result)
    if result["missing_nodes"] and not p["allow_missing"]:
        module.fail_json(msg="nodes not found in Kubernetes: %s" % ", ".join(result["missing_nodes"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
