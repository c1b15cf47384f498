#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_hostlist
short_description: Expand or compress a Slurm hostlist
description:
  - Pure Python equivalent of C(scontrol show hostnames) / C(scontrol show hostlist) for the
    simple forms used by GPU pools (C(prefix[1-3,7]), zero padding, several bracket groups).
  - Every resulting name is validated against the node name grammar.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  hostlist:
    description: A hostlist to expand, e.g. C(gpu-[1-4,9]).
    type: str
  names:
    description: Node names to compress.
    type: list
    elements: str
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.info
"""

EXAMPLES = r"""
- name: Expand
  autoheal.cluster.slurm_hostlist:
    hostlist: "gpu-[1-3]"
  register: hl   # hl.names == [gpu-1, gpu-2, gpu-3]
"""

RETURN = r"""
names:
  description: Expanded, validated node names.
  returned: always
  type: list
  elements: str
hostlist:
  description: Compressed hostlist.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.hostlist import (
    compress_hostlist,
    expand_hostlist,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(hostlist=dict(type="str"), names=dict(type="list", elements="str")),
        required_one_of=[("hostlist", "names")],
        mutually_exclusive=[("hostlist", "names")],
        supports_check_mode=True,
    )
    names = module.params["names"]
    if module.params["hostlist"] is not None:
        try:
            names = expand_hostlist(module.params["hostlist"])
        except ValueError as exc:
            module.fail_json(msg=str(exc))
    names = validate_nodes(module, names)
    module.exit_json(changed=False, names=names, hostlist=compress_hostlist(names))


if __name__ == "__main__":
    main()
