#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: evidence
short_description: Collect a node's evidence bundle for the GPU vendor before it is rebooted or retired
description:
  - >-
    Writes O(dir)/<incident>-<node>/ with C(summary.json) (incident, node, XID, GPU, the GPUs'
    UUIDs and serials, the validation result when given, when it was taken), C(xid_lines.txt) (the
    driver's Xid, SXid and fallen-off-the-bus lines of the node's kernel log) and C(metrics.txt)
    (the node's last GPU metrics), then the same as a C(.tar.gz) beside it: what a human hands to
    support. A reboot clears the kernel log and the GPU's state, so the bundle is taken first.
  - >-
    Idempotent - a bundle that exists is kept as it is (C(changed=false)): a rerun of the runbook
    never overwrites what was collected before the reboot. In check mode nothing is written.
  - Sources that cannot be read are recorded in C(summary.json) as C(missing), never fatal.
version_added: 0.3.0
author: autoheal maintainers (@autoheal-project)
options:
  node:
    description: The node.
    type: str
    required: true
  incident_id:
    description: The incident the bundle belongs to (C(manual) when run by hand).
    type: str
    default: manual
  xid:
    description: The XID.
    type: int
    required: true
  gpu:
    description: The GPU index, when known.
    type: int
  dir:
    description: Directory holding bundles (absolute; created when missing).
    type: path
    required: true
  kmsg:
    description: The node's kernel log as a file of records (lab), or empty.
    type: path
    default: ""
  metrics_url:
    description: A Prometheus text endpoint with the node's GPU metrics (dcgm-exporter), or empty.
    type: str
    default: ""
  gpus:
    description: The node's GPUs, each with C(gpu), C(uuid) and, when known, C(serial).
    type: list
    elements: dict
    default: []
  validation:
    description: The last validation result, kept in the summary.
    type: dict
    default: {}
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.no_diff
"""

EXAMPLES = r"""
- name: Evidence before the reboot
  autoheal.cluster.evidence:
    node: gpu-3
    incident_id: inc-0123456789ab
    xid: 79
    gpu: 3
    dir: /var/lib/autoheal/evidence
    metrics_url: http://gpu-3:9400/metrics
"""

RETURN = r"""
path:
  description: The bundle (.tar.gz).
  returned: always
  type: str
bundle_dir:
  description: The bundle's directory.
  returned: always
  type: str
missing:
  description: Sources that could not be read.
  returned: always
  type: list
  elements: str
"""

import json
import os
import re
import tarfile
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes

# what the vendor wants from the kernel log: the driver's fault lines and the GPU announcements
DRIVER_LINE = re.compile(r"NVRM: Xid|SXid|fallen off the bus|NVRM: GPU at PCI")
SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_LINES = 500


def argument_spec() -> dict[str, Any]:
    return dict(
        node=dict(type="str", required=True),
        incident_id=dict(type="str", default="manual"),
        xid=dict(type="int", required=True),
        gpu=dict(type="int"),
        dir=dict(type="path", required=True),
        kmsg=dict(type="path", default=""),
        metrics_url=dict(type="str", default=""),
        gpus=dict(type="list", elements="dict", default=[]),
        validation=dict(type="dict", default={}),
    )


def driver_lines(path: str) -> list[str]:
    """The driver's lines of a kernel log (the last MAX_LINES), printable ASCII only."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [ln.rstrip("\n") for ln in fh if DRIVER_LINE.search(ln)]
    return ["".join(c if " " <= c <= "~" else "?" for c in ln) for ln in lines[-MAX_LINES:]]


def node_metrics(url: str, node: str) -> list[str]:
    """The exposition lines of `url` that belong to `node` (label Hostname)."""
    with open_url(url, timeout=10) as resp:  # an operator-given URL (the node's metrics endpoint)
        text = resp.read(8 << 20).decode("utf-8", errors="replace")
    mark = f'Hostname="{node}"'
    return [ln for ln in text.splitlines() if mark in ln and not ln.startswith("#")]


def collect(p: dict[str, Any], bundle: str) -> list[str]:
    """Write the bundle's files; returns the sources that could not be read."""
    missing: list[str] = []
    lines: list[str] = []
    if p["kmsg"]:
        try:
            lines = driver_lines(p["kmsg"])
        except OSError as exc:
            missing.append(f"kmsg: {exc}")
    metrics: list[str] = []
    if p["metrics_url"]:
        try:
            metrics = node_metrics(p["metrics_url"], p["node"])
        except (OSError, ValueError) as exc:
            missing.append(f"metrics: {exc}")
    summary = {
        "incident": p["incident_id"],
        "node": p["node"],
        "xid": p["xid"],
        "gpu": p["gpu"],
        "gpus": p["gpus"],
        "validation": p["validation"],
        "collected_at": time.time(),
        "missing": missing,
    }
    os.makedirs(bundle, mode=0o750, exist_ok=True)
    for name, content in (
        ("summary.json", json.dumps(summary, indent=1, sort_keys=True)),
        ("xid_lines.txt", "\n".join(lines)),
        ("metrics.txt", "\n".join(metrics)),
    ):
        with open(os.path.join(bundle, name), "w", encoding="utf-8") as fh:
            fh.write(content + "\n")
    return missing


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    validate_nodes(module, [p["node"]], field="node")
    if not SAFE_ID.match(p["incident_id"]):
        module.fail_json(msg=f"incident_id: {p['incident_id']!r} is not an incident id")
    if not os.path.isabs(p["dir"]):
        module.fail_json(msg=f"dir: {p['dir']!r} must be an absolute path")
    bundle = os.path.join(p["dir"], f"{p['incident_id']}-{p['node']}")
    tarball = bundle + ".tar.gz"
    if os.path.exists(tarball):
        module.exit_json(changed=False, path=tarball, bundle_dir=bundle, missing=[])
    if module.check_mode:
        module.exit_json(changed=True, path=tarball, bundle_dir=bundle, missing=[])
    missing = collect(p, bundle)
    tmp = tarball + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(bundle, arcname=os.path.basename(bundle))
    os.replace(tmp, tarball)  # a bundle is whole or absent: the idempotence check relies on it
    module.exit_json(changed=True, path=tarball, bundle_dir=bundle, missing=missing)


if __name__ == "__main__":
    main()
