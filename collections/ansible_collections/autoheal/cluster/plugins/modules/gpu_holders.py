#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_holders
short_description: Name the pods holding the GPUs of each node of a batch - GPU agents and everyone else
description:
  - A GPU reset needs every process off the GPU, and a validation that is given the node's GPUs needs
    them unallocated. For each node this lists the pods that hold its GPUs - pods that request
    C(nvidia.com/gpu) and the GPU agents named by O(agents) (dcgm-exporter holds the GPUs through
    NVML without requesting them) - and sorts them into RV(agents) (autoheal's to stop) and
    RV(users) (anyone else's; a reset or validation on that node is refused naming them).
  - Finished pods (Succeeded, Failed) hold nothing and are left out. A pod still terminating does
    hold its GPUs and is listed.
  - Reads only.
version_added: 0.3.0
author: autoheal maintainers (@autoheal-project)
options:
  agents:
    description:
      - Label selectors (C(key=value), all of one entry must match) of the pods that are GPU agents
        autoheal may stop - the stack's dcgm-exporter and slurmd DaemonSets.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.info
  - autoheal.cluster.nodes
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Who holds the GPUs
  autoheal.cluster.gpu_holders:
    nodes: "{{ nodes }}"
    agents: [app.kubernetes.io/component=gpu-metrics, app.kubernetes.io/component=slurmd]
  register: holders
  # holders.users == {gpu-3: ["team-a/trainer-0 (2 nvidia.com/gpu)"]}
"""

RETURN = r"""
agents:
  description: "C({node: [namespace/name]}) - the GPU agents on each node (nodes without any left out)."
  returned: always
  type: dict
users:
  description: "C({node: [namespace/name (N nvidia.com/gpu)]}) - the other pods holding GPUs."
  returned: always
  type: dict
failed:
  description: "C({node: why}) - nodes that could not be read (missing, API error)."
  returned: always
  type: dict
"""

import contextlib
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import KUBE_COMMON_ARGS, Kube, Obj
from ansible_collections.autoheal.cluster.plugins.module_utils.node_job import GPU_RESOURCE
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        agents=dict(type="list", elements="str", default=[]),
    )
    spec.update(KUBE_COMMON_ARGS)
    return spec


def parse_selectors(module: Any, selectors: list[str]) -> list[dict[str, str]]:
    out = []
    for sel in selectors:
        pairs = [part.split("=", 1) for part in sel.split(",") if part.strip()]
        if not pairs or any(len(p) != 2 or not p[0].strip() for p in pairs):
            module.fail_json(msg=f"agents: {sel[:80]!r} is not a selector of key=value pairs")
        out.append({k.strip(): v.strip() for k, v in pairs})
    return out


def gpus_of(pod: Obj) -> int:
    """What the pod requests of nvidia.com/gpu (limits count where requests are not given)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        raw = (res.get("requests") or {}).get(GPU_RESOURCE) or (res.get("limits") or {}).get(GPU_RESOURCE)
        with contextlib.suppress(ValueError):
            total += int(str(raw or 0))
    return total


def sort_pods(pods: list[Obj], agents: list[dict[str, str]]) -> tuple[list[str], list[str]]:
    """(agents, users) among the pods of one node."""
    mine, theirs = [], []
    for pod in pods:
        if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if any(all(labels.get(k) == v for k, v in sel.items()) for sel in agents):
            mine.append(key)
        elif gpus_of(pod) > 0:
            theirs.append(f"{key} ({gpus_of(pod)} {GPU_RESOURCE})")
    return sorted(mine), sorted(theirs)


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    nodes = validate_nodes(module, module.params["nodes"])
    agents = parse_selectors(module, module.params["agents"])
    kube = Kube(module)

    def read(node: str) -> tuple[list[str], list[str]] | None:
        if kube.get_node(node) is None:
            return None
        return sort_pods(kube.pods_on(node), agents)

    res = kube.map(read, nodes)
    out: dict[str, Any] = dict(changed=False, agents={}, users={}, failed={})
    for node in nodes:
        found, err = res[node]
        if err or found is None:
            out["failed"][node] = f"cannot read the node's pods: {err}" if err else "the node does not exist"
            continue
        if found[0]:
            out["agents"][node] = found[0]
        if found[1]:
            out["users"][node] = found[1]
    module.exit_json(**out)


if __name__ == "__main__":
    main()
