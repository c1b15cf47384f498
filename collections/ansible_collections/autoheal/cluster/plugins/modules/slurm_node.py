#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_node
short_description: Drain, down or resume a batch of Slurm nodes, owning only autoheal's reasons
description:
  - Sets the state of a list of Slurm nodes with one C(scontrol update nodename=<hostlist>) call.
  - The reason is owned by autoheal - it always starts with O(reason_prefix) (added when missing).
  - A node that is already drained or down with a reason B(without) that prefix was put there by an
    administrator (or by Slurm itself, e.g. C(Not responding)); it is never overridden or resumed and
    is reported in RV(skipped_nodes).
  - O(state=drain) is satisfied by a node that is drained B(or down) with exactly the wanted reason;
    O(state=down) by a node that is down with that reason; O(state=resume) by a node that is neither
    drained nor down.
  - Reads state with C(sinfo --json) (Slurm 22.05 openapi/v0.0.38 and newer layouts), so it reports
    C(changed) only when it sends an update, and verifies the new state afterwards.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  state:
    description:
      - Wanted state. C(keep) leaves the state alone and only manages O(comment).
    type: str
    required: true
    choices: [drain, down, resume, keep]
  reason:
    description:
      - Reason to set with O(state=drain) or O(state=down), e.g. C(XID 79 gpu3 inc-123).
      - O(reason_prefix) is prepended when missing.
      - Letters, digits, space and C(_.,:;/+()#@%=-[]) only, at most 240 characters.
    type: str
  reasons:
    description:
      - >-
        Per node reasons, C({node: reason}), overriding O(reason) for those nodes (e.g. each with
        its own incident id). Nodes sharing a reason share one C(scontrol) call; the calls for
        different reasons run concurrently.
    type: dict
    default: {}
  reason_prefix:
    description: The prefix that marks a reason as ours.
    type: str
    default: "autoheal: "
  only_reason:
    description:
      - With O(state=resume), resume only nodes whose current reason equals this text (e.g. the
        hot-spare reason); others that are drained or down are skipped.
    type: str
  comment:
    description:
      - >-
        Node comment to set in the same call (e.g. C(autoheal: replaces gpu-3)); an empty string
        clears it. Left alone when omitted.
    type: str
  allow_missing:
    description: Do not fail when some nodes are unknown to Slurm (they are still reported).
    type: bool
    default: false
  verify_seconds:
    description: How long to wait for slurmctld to show the new state before failing.
    type: float
    default: 10
notes:
  - Check mode reports what would change and runs only read-only commands.
  - Supports diff mode (per node state, flags and reason before and after).
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.diff
  - autoheal.cluster.nodes
  - autoheal.cluster.slurm
"""

EXAMPLES = r"""
- name: Fence the failed nodes in Slurm (one scontrol call for the batch)
  autoheal.cluster.slurm_node:
    nodes: [gpu-3, gpu-4]
    state: drain
    reason: "XID 79 gpu3 inc-42"
    slurm_conf: /etc/slurm/slurm.conf

- name: Set them down once their jobs are requeued
  autoheal.cluster.slurm_node:
    nodes: [gpu-3, gpu-4]
    state: down
    reason: "XID 79 gpu3 inc-42"

- name: Promote a hot spare (only if it still carries the spare reason)
  autoheal.cluster.slurm_node:
    nodes: [gpu-5]
    state: resume
    only_reason: "autoheal: hot spare"
    comment: "autoheal: replaces gpu-3 inc-42"
"""

RETURN = r"""
changed_nodes:
  description: Nodes updated (or that would be, in check mode).
  returned: always
  type: list
  elements: str
  sample: [gpu-3]
unchanged_nodes:
  description: Nodes already in the wanted state.
  returned: always
  type: list
  elements: str
skipped_nodes:
  description: Nodes left alone because someone else holds them (reason not ours).
  returned: always
  type: list
  elements: dict
  sample: [{node: gpu-4, state: idle, flags: [DRAIN], reason: "bad dimm, ticket 881"}]
missing_nodes:
  description: Nodes Slurm does not know.
  returned: always
  type: list
  elements: str
reasons:
  description: The full per node reasons used (with prefix).
  returned: always
  type: dict
reason:
  description: The full reason used (with prefix).
  returned: always
  type: str
  sample: "autoheal: XID 79 gpu3 inc-42"
hostlist:
  description: The hostlist passed to scontrol (empty when nothing changed).
  returned: always
  type: str
  sample: gpu-[3-4]
nodes_after:
  description: Per node state after the change (predicted in check mode).
  returned: always
  type: dict
commands:
  description: Commands run (argv lists).
  returned: always
  type: list
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    DEFAULT_PREFIX,
    SLURM_COMMON_ARGS,
    Slurm,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm_state import (
    StateError,
    Want,
    build_reasons,
    set_state,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes, validate_text


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        state=dict(type="str", required=True, choices=["drain", "down", "resume", "keep"]),
        reason=dict(type="str"),
        reasons=dict(type="dict", default={}),
        reason_prefix=dict(type="str", default=DEFAULT_PREFIX),
        only_reason=dict(type="str"),
        comment=dict(type="str"),
        allow_missing=dict(type="bool", default=False),
        verify_seconds=dict(type="float", default=10),
    )
    spec.update(SLURM_COMMON_ARGS)
    return spec


def wanted(module: Any, nodes: list[str]) -> Want:
    """The checked target: state, reasons (ours, prefixed), comment."""
    p = module.params
    reason, per_node = build_reasons(module, p["reason_prefix"], p["reason"], p["reasons"])
    if p["state"] in ("drain", "down"):
        missing_reason = [n for n in nodes if per_node.get(n, reason) is None]
        if missing_reason:
            module.fail_json(msg="no reason for: " + ", ".join(missing_reason))
    if p["comment"]:
        validate_text(module, p["comment"], "comment")
    return Want(
        p["state"],
        reason,
        per_node,
        p["reason_prefix"],
        only_reason=p["only_reason"],
        comment=p["comment"],
        allow_missing=p["allow_missing"],
        verify_seconds=p["verify_seconds"],
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        required_if=[
            ("state", "drain", ["reason", "reasons"], True),
            ("state", "down", ["reason", "reasons"], True),
        ],
    )
    nodes = validate_nodes(module, module.params["nodes"])
    want = wanted(module, nodes)
    try:
        result = set_state(module, Slurm(module), nodes, want)
    except StateError as exc:
        module.fail_json(msg=exc.msg, **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
