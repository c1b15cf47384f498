#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: fence
short_description: Fence a batch of nodes in Slurm and Kubernetes at once, in one task
description:
  - >-
    Drains the nodes in Slurm with reasons autoheal owns (what M(autoheal.cluster.slurm_node) does
    with O(autoheal.cluster.slurm_node#module:state=drain)) and, at the same time, quarantines them
    in Kubernetes - cordon, the quarantine taint, the state label and the incident annotation (what
    M(autoheal.cluster.k8s_nodes) does for the k8s_node role's fence). Both halves run concurrently
    in one module process.
  - >-
    Why one module: the fence is the step between an alert and safety, and each Ansible module task
    costs ~0.4 s of Python start-up on top of its work; two tasks one after the other cost about
    twice the time of this one (measured, bench/mttr.py).
  - Both halves always run to completion; if either fails, the task fails with both results.
  - An administrator's drain reason, and a cordon someone else set, are left alone (reported).
version_added: 0.2.0
author: autoheal maintainers
extends_documentation_fragment:
  - autoheal.cluster.slurm
  - autoheal.cluster.kube
options:
  nodes:
    description: Node names (the same name in Slurm and Kubernetes).
    type: list
    elements: str
    required: true
  reason:
    description: Slurm reason for every node (our prefix is added).
    type: str
  reasons:
    description: Per node Slurm reasons, overriding O(reason).
    type: dict
    default: {}
  reason_prefix:
    description: Prefix marking the reasons autoheal owns.
    type: str
    default: "autoheal: "
  incident_ids:
    description: Incident ids parallel to O(nodes), written into each node's incident annotation.
    type: list
    elements: str
    default: []
  tier:
    description: Value of the quarantine taint (the fault's tier).
    type: str
    default: replace
  kubernetes:
    description: Quarantine in Kubernetes too; V(false) fences in Slurm only.
    type: bool
    default: true
  taint_key:
    description: Key of the quarantine taint.
    type: str
    default: autoheal.io/quarantine
  taint_effect:
    description: Effect of the quarantine taint (NoSchedule lets PodDisruptionBudgets and the grace period rule).
    type: str
    default: NoSchedule
    choices: [NoSchedule, PreferNoSchedule, NoExecute]
  state_label:
    description: Label set to C(quarantined).
    type: str
    default: autoheal.io/state
  incident_annotation:
    description: Annotation holding the node's incident id.
    type: str
    default: autoheal.io/incident
  allow_missing:
    description: Do not fail on nodes unknown to Slurm or Kubernetes (they are reported).
    type: bool
    default: false
  verify_seconds:
    description: Seconds to wait for Slurm to show the drain.
    type: float
    default: 10
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Fence the failed nodes (Slurm drain + Kubernetes quarantine, concurrently)
  autoheal.cluster.fence:
    nodes: [gpu-3, gpu-4]
    incident_ids: [inc-42, inc-43]
    reasons: {gpu-3: "XID 79 gpu3 inc-42", gpu-4: "XID 79 gpu1 inc-43"}
    tier: replace
    slurm_conf: /etc/slurm/slurm.conf
    kubeconfig: /etc/autoheal/kubeconfig
  register: fence
"""

RETURN = r"""
slurm:
  description: The Slurm half, shaped like M(autoheal.cluster.slurm_node)'s result.
  returned: always
  type: dict
kube:
  description: The Kubernetes half, shaped like M(autoheal.cluster.k8s_nodes)'s result ({} when O(kubernetes=false)).
  returned: always
  type: dict
"""

from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import KUBE_COMMON_ARGS, Kube
from ansible_collections.autoheal.cluster.plugins.module_utils.kube_nodes import (
    CORDON_OWNER_ANNOTATION,
    NodesError,
    apply,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    DEFAULT_PREFIX,
    SLURM_COMMON_ARGS,
    Slurm,
    SlurmError,
    validate_nodes,
    validate_text,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm_state import (
    StateError,
    build_reasons,
    set_state,
)


def main():
    argument_spec = dict(
        nodes=dict(type="list", elements="str", required=True),
        reason=dict(type="str"),
        reasons=dict(type="dict", default={}),
        reason_prefix=dict(type="str", default=DEFAULT_PREFIX),
        incident_ids=dict(type="list", elements="str", default=[]),
        tier=dict(type="str", default="replace"),
        kubernetes=dict(type="bool", default=True),
        taint_key=dict(type="str", default="autoheal.io/quarantine", no_log=False),
        taint_effect=dict(type="str", default="NoSchedule", choices=["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        state_label=dict(type="str", default="autoheal.io/state"),
        incident_annotation=dict(type="str", default="autoheal.io/incident"),
        allow_missing=dict(type="bool", default=False),
        verify_seconds=dict(type="float", default=10),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    argument_spec.update(KUBE_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True,
                           required_one_of=[("reason", "reasons")])
    p = module.params
    nodes = validate_nodes(module, p["nodes"])
    ids = list(p["incident_ids"])
    for i in ids:
        validate_text(module, i, "incident_ids")
    validate_text(module, p["tier"], "tier")
    prefix = p["reason_prefix"]
    reason, per_node = build_reasons(module, prefix, p["reason"], p["reasons"])
    missing_reason = [n for n in nodes if per_node.get(n, reason) is None]
    if missing_reason:
        module.fail_json(msg="no reason for: %s" % ", ".join(missing_reason))

    slurm = Slurm(module)
    slurm.require("sinfo", "scontrol")
    slurm.raise_errors = True  # it runs in a thread: errors come back as exceptions
    kube = Kube(module) if p["kubernetes"] else None
    quarantine = dict(
        cordon=True,
        cordon_owned_only=True,
        cordon_owner_annotation=CORDON_OWNER_ANNOTATION,
        labels={p["state_label"]: "quarantined"},
        annotations={},
        node_annotations=(dict((n, {p["incident_annotation"]: i}) for n, i in zip(nodes, ids))
                          if len(ids) == len(nodes) else {}),
        taints=[dict(key=p["taint_key"], value=p["tier"], effect=p["taint_effect"], state="present")],
        allow_missing=p["allow_missing"],
    )

    def drain():
        return set_state(module, slurm, nodes, "drain", reason, per_node, prefix, None, None,
                         p["allow_missing"], p["verify_seconds"])

    out = dict(changed=False, slurm={}, kube={})
    errors = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = dict(slurm=pool.submit(drain))
        if kube is not None:
            futures["kube"] = pool.submit(apply, module, kube, nodes, quarantine)
        for half, fut in futures.items():
            try:
                out[half] = fut.result()
            except (StateError, NodesError) as exc:
                out[half] = exc.result
                errors.append("%s: %s" % (half, exc.msg))
            except SlurmError as exc:
                errors.append("%s: %s" % (half, exc))
            except Exception as exc:  # a bug in one half must not hide the other half's result
                errors.append("%s: %s: %s" % (half, type(exc).__name__, exc))
    out["changed"] = any(r.get("changed") for r in (out["slurm"], out["kube"]))
    if module._diff and out["changed"]:
        out["diff"] = dict(
            before=dict(slurm=out["slurm"].get("diff", {}).get("before", {}),
                        kube=out["kube"].get("diff", {}).get("before", {})),
            after=dict(slurm=out["slurm"].get("diff", {}).get("after", {}),
                       kube=out["kube"].get("diff", {}).get("after", {})),
        )
    if errors:
        module.fail_json(msg="; ".join(errors), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
