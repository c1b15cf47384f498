#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_node_info
short_description: Read the state of Slurm nodes (22.05 and newer JSON layouts)
description:
  - Runs C(sinfo --json) once and returns every node (or the requested ones) with a normalised
    record - base C(state) (lower case), C(flags), C(reason), C(comment), C(features),
    C(partitions), booleans C(drained), C(down), C(responding), C(owned) (reason empty or ours)
    and C(comment_owned) (a comment autoheal set), and C(pool) (from a C(pool_<name>) feature).
  - See the M(autoheal.cluster.slurm_jobs) documentation for the JSON differences between releases.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  nodes:
    description: Node names to return; all nodes when omitted. Unknown names go to RV(missing_nodes).
    type: list
    elements: str
  reason_prefix:
    description: Prefix that marks a reason as ours.
    type: str
    default: "autoheal: "
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.info
  - autoheal.cluster.slurm
"""

EXAMPLES = r"""
- name: Read the failed nodes
  autoheal.cluster.slurm_node_info:
    nodes: "{{ autoheal_nodes }}"
  register: slurm_info
"""

RETURN = r"""
nodes:
  description: Node records keyed by name.
  returned: always
  type: dict
  sample: {gpu-5: {state: idle, flags: [DRAIN], reason: "autoheal: hot spare", pool: h100}}
missing_nodes:
  description: Requested nodes Slurm does not know.
  returned: always
  type: list
  elements: str
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    DEFAULT_PREFIX,
    SLURM_COMMON_ARGS,
    Slurm,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str"),
        reason_prefix=dict(type="str", default=DEFAULT_PREFIX),
    )
    spec.update(SLURM_COMMON_ARGS)
    return spec


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    wanted = module.params["nodes"]
    if wanted is not None:
        wanted = validate_nodes(module, wanted)
    prefix = module.params["reason_prefix"].rstrip()
    found = Slurm(module).nodes(wanted)
    for rec in found.values():
        rec["owned"] = rec["reason"] == "" or rec["reason"].startswith(prefix)
        rec["comment_owned"] = rec["comment"].startswith(prefix)
        rec["pool"] = next((f[5:] for f in rec["features"] if f.startswith("pool_")), None)
    missing = [n for n in (wanted or []) if n not in found]
    module.exit_json(changed=False, nodes=found, missing_nodes=missing)


if __name__ == "__main__":
    main()
