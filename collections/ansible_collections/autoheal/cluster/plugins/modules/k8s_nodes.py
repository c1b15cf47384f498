#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

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
author: autoheal maintainers (@autoheal-project)
options:
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
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.diff
  - autoheal.cluster.nodes
  - autoheal.cluster.kube
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

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import KUBE_COMMON_ARGS, Kube
from ansible_collections.autoheal.cluster.plugins.module_utils.kube_nodes import (
    CORDON_OWNER_ANNOTATION,
    NodesError,
    apply,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes

EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
TAINT_OPTIONS = dict(
    key=dict(type="str", required=True, no_log=False),
    value=dict(type="str"),
    effect=dict(type="str", choices=EFFECTS),
    state=dict(type="str", default="present", choices=["present", "absent"]),
)


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        cordon=dict(type="bool"),
        cordon_owned_only=dict(type="bool", default=True),
        cordon_owner_annotation=dict(type="str", default=CORDON_OWNER_ANNOTATION),
        labels=dict(type="dict", default={}),
        annotations=dict(type="dict", default={}),
        node_annotations=dict(type="dict", default={}),
        taints=dict(type="list", elements="dict", default=[], options=TAINT_OPTIONS),
        allow_missing=dict(type="bool", default=False),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    names = validate_nodes(module, module.params["nodes"])
    try:
        result = apply(module, Kube(module), names, module.params)
    except NodesError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
