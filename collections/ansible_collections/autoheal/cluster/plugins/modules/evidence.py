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
    UUIDs and serials, the validation result when given, the evidence Job's record, what could
    not be read, when it was taken), C(xid_lines.txt) (the driver's Xid, SXid and
    fallen-off-the-bus lines: of the node's kernel log O(kmsg), and those the XID watcher saw,
    O(kernel_lines)), C(metrics.txt) (the node's last GPU metrics from an exposition endpoint),
    C(prometheus.json) (its DCGM_FI_DEV_* series over the last O(metrics_window) seconds, from
    O(prometheus_url)) and C(nvidia_smi_q.txt) and C(dcgm_health.json) (what the node said, from
    its evidence Job, O(nodes[].report)), then the same as a C(.tar.gz) beside it: what a human
    hands to support. A reboot clears the kernel log and the GPU's state, so the bundle is taken
    first. Files and the tarball are readable by owner and group only.
  - >-
    One node (O(node) with its sources) or a batch (O(nodes), one entry per node with its own
    sources) in one module run - a storm's 100 nodes are one process, not 100. In a batch every
    metrics endpoint is read once, however many nodes share it, and the endpoints are read side by
    side.
  - >-
    Idempotent - a bundle that exists is kept as it is (C(changed=false) for that node): a rerun
    of the runbook never overwrites what was collected before the reboot. In check mode nothing is
    written and nothing is read; the result names the bundles that would be written.
  - >-
    Sources that cannot be read (a file, an endpoint, Prometheus, a failed or timed-out evidence
    Job) are recorded in C(summary.json) as C(missing) with the cause, never fatal. Every text from
    a source is kept to printable ASCII and bounded (a kernel line 512 characters, 500 lines per
    node, a Job's logs 1 MiB, a Prometheus answer 8 MiB).
version_added: 0.3.0
author: autoheal maintainers (@autoheal-project)
options:
  node:
    description:
      - The node (one bundle). Give O(node) or O(nodes).
      - O(incident_id), O(kmsg), O(metrics_url), O(gpus), O(validation) and O(report) belong to this form;
        with O(nodes) each entry carries its own.
    type: str
  nodes:
    description:
      - The batch, one entry per node (each node at most once). Give O(node) or O(nodes).
    type: list
    elements: dict
    version_added: 0.3.0
    suboptions:
      node:
        description: The node.
        type: str
        required: true
      incident_id:
        description: The incident the bundle belongs to (C(manual) when run by hand).
        type: str
        default: manual
      kmsg:
        description: The node's kernel log as a file of records (lab), or empty.
        type: path
        default: ""
      metrics_url:
        description: A Prometheus text endpoint with the node's GPU metrics, or empty.
        type: str
        default: ""
      gpus:
        description: The node's GPUs, each with C(gpu), C(uuid) and, when known, C(serial).
        type: list
        elements: dict
        default: []
      validation:
        description: The node's last validation result, kept in the summary.
        type: dict
        default: {}
      report:
        description:
          - The node's evidence Job, as one entry of the C(node_results) of
            P(autoheal.cluster.node_job#module) (C({ok, exit_code, reason, logs, job})); its logs are
            cut into the sections the Job's script marks with C(### autoheal-evidence <command>)
            and C(### autoheal-evidence rc=<n>) - C(nvidia-smi -q) and C(dcgmi health -c -j).
          - Omitted - no evidence Job ran (the lab). A failed Job, or a section missing or failed, is
            recorded as missing with the Job's reason.
        type: dict
        version_added: 0.3.0
  incident_id:
    description: The incident the bundle of O(node) belongs to (C(manual) when run by hand).
    type: str
    default: manual
  xid:
    description: The XID (of every node of a batch).
    type: int
    required: true
  gpu:
    description: The GPU index, when known (of every node of a batch).
    type: int
  dir:
    description: Directory holding bundles (absolute; created when missing).
    type: path
    required: true
  kmsg:
    description: The kernel log of O(node) as a file of records (lab), or empty.
    type: path
    default: ""
  metrics_url:
    description: A Prometheus text endpoint with the GPU metrics of O(node) (dcgm-exporter), or empty.
    type: str
    default: ""
  gpus:
    description: The GPUs of O(node), each with C(gpu), C(uuid) and, when known, C(serial).
    type: list
    elements: dict
    default: []
  validation:
    description: The last validation result of O(node), kept in the summary.
    type: dict
    default: {}
  report:
    description: The evidence Job of O(node) (P(autoheal.cluster.node_job#module)'s C(node_results) entry).
    type: dict
    version_added: 0.3.0
  kernel_lines:
    description:
      - 'The XID watcher''s kernel lines of the batch''s nodes: a JSON file C({"nodes": {node: [line]}})
        the runner writes for each run (remediation/kernel_lines.py, extra var C(autoheal_kernel_lines)).'
      - Empty - none. A file that cannot be read is recorded as missing in every bundle.
    type: path
    default: ""
    version_added: 0.3.0
  prometheus_url:
    description:
      - Prometheus (its HTTP API) to read the nodes' DCGM_FI_DEV_* series from; empty - not read.
      - One range query per 25 nodes, the queries side by side.
    type: str
    default: ""
    version_added: 0.3.0
  metrics_window:
    description: Seconds of the series read from O(prometheus_url), up to now.
    type: int
    default: 600
    version_added: 0.3.0
  metrics_step:
    description: Seconds between the points read from O(prometheus_url).
    type: int
    default: 30
    version_added: 0.3.0
notes:
  - >-
    Only the lines of a metrics endpoint whose C(Hostname) label names the node are kept, so one
    endpoint for the whole cluster (a Prometheus federation) serves a batch as well as one
    endpoint per node. At most 8 MiB of an endpoint is read.
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

- name: Evidence for a batch, one module run
  autoheal.cluster.evidence:
    nodes:
      - node: gpu-3
        incident_id: inc-0123456789ab
        metrics_url: http://gpu-3:9400/metrics
      - node: gpu-7
        incident_id: inc-0123456789ac
        metrics_url: http://gpu-7:9400/metrics
        validation:
          failures: [GPU 0 - XID 79]
    xid: 79
    dir: /var/lib/autoheal/evidence
  register: evidence

- name: Evidence on a real node - the watcher's lines, the node's report, Prometheus
  autoheal.cluster.evidence:
    nodes:
      - node: gpu-3
        incident_id: inc-0123456789ab
        report: "{{ evidence_jobs.node_results['gpu-3'] }}"
    xid: 79
    dir: /var/lib/autoheal/evidence
    kernel_lines: /var/lib/autoheal/runs/12/kernel-lines.json
    prometheus_url: http://prometheus.monitoring:9090

- name: Each node's bundle
  ansible.builtin.debug:
    msg: "{{ evidence.paths }}"
"""

RETURN = r"""
path:
  description: The bundle (.tar.gz) of O(node).
  returned: when O(node) is given
  type: str
bundle_dir:
  description: The bundle's directory, for O(node).
  returned: when O(node) is given
  type: str
missing:
  description: Sources of O(node) that could not be read.
  returned: when O(node) is given
  type: list
  elements: str
paths:
  description: Each node's bundle (.tar.gz), by node name.
  returned: always
  type: dict
  sample: {"gpu-3": "/var/lib/autoheal/evidence/inc-0123456789ab-gpu-3.tar.gz"}
bundles:
  description: One entry per node, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    node:
      description: The node.
      type: str
    incident_id:
      description: The incident.
      type: str
    path:
      description: The bundle (.tar.gz).
      type: str
    bundle_dir:
      description: The bundle's directory.
      type: str
    changed:
      description: Whether the bundle was written in this run (in check mode, would be written).
      type: bool
    missing:
      description: Sources that could not be read (empty when the bundle was kept or in check mode).
      type: list
      elements: str
"""

import json
import os
import re
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.autoheal.cluster.plugins.module_utils.evidence_sources import (
    PROMETHEUS_CHUNK,
    kernel_lines,
    node_report,
    prometheus_series,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import shown, validate_nodes

# what the vendor wants from the kernel log: the driver's fault lines and the GPU announcements
DRIVER_LINE = re.compile(r"NVRM: Xid|SXid|fallen off the bus|NVRM: GPU at PCI")
HOSTNAME = re.compile(r'Hostname="([^"]*)"')
SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
HTTP_URL = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")
MAX_LINES = 500
MAX_METRICS = 8 << 20  # bytes read from one metrics endpoint
METRICS_WORKERS = 8  # endpoints read side by side
FILE_MODE = 0o640  # node facts for support: owner and group only
# the sources of one node: in O(nodes) entries, and at the top level for O(node)
PER_NODE = ("incident_id", "kmsg", "metrics_url", "gpus", "validation", "report")
NODE_OPTIONS = dict(
    node=dict(type="str", required=True),
    incident_id=dict(type="str", default="manual"),
    kmsg=dict(type="path", default=""),
    metrics_url=dict(type="str", default=""),
    gpus=dict(type="list", elements="dict", default=[]),
    validation=dict(type="dict", default={}),
    report=dict(type="dict"),
)


@dataclass
class Readings:
    """What the batch's shared sources gave, read once for all the nodes to be written."""

    metrics: dict[str, Any] = field(default_factory=dict)  # read_metrics
    kernel: dict[str, list[str]] | str | None = None  # {node: lines}, why not, None: no file given
    prometheus: dict[str, Any] = field(default_factory=dict)  # {node: series reading or why not}


def argument_spec() -> dict[str, Any]:
    return dict(
        node=dict(type="str"),
        nodes=dict(type="list", elements="dict", options=NODE_OPTIONS),
        incident_id=dict(type="str", default="manual"),
        xid=dict(type="int", required=True),
        gpu=dict(type="int"),
        dir=dict(type="path", required=True),
        kmsg=dict(type="path", default=""),
        metrics_url=dict(type="str", default=""),
        gpus=dict(type="list", elements="dict", default=[]),
        validation=dict(type="dict", default={}),
        report=dict(type="dict"),
        kernel_lines=dict(type="path", default=""),
        prometheus_url=dict(type="str", default=""),
        metrics_window=dict(type="int", default=600),
        metrics_step=dict(type="int", default=30),
    )


def driver_lines(path: str) -> list[str]:
    """The driver's lines of a kernel log (the last MAX_LINES), printable ASCII only."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [ln.rstrip("\n") for ln in fh if DRIVER_LINE.search(ln)]
    return ["".join(c if " " <= c <= "~" else "?" for c in ln) for ln in lines[-MAX_LINES:]]


def fetch(url: str, headers: Mapping[str, str]) -> bytes:
    """GET `url` (an operator-given endpoint), at most MAX_METRICS + 1 bytes."""
    with open_url(url, timeout=10, headers=dict(headers)) as resp:
        return bytes(resp.read(MAX_METRICS + 1))


def metrics_by_node(url: str, nodes: set[str]) -> dict[str, list[str]]:
    """The exposition lines of `url` for each of `nodes` (label Hostname), in one read."""
    text = fetch(url, {})[:MAX_METRICS].decode("utf-8", errors="replace")
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for ln in text.splitlines():
        if ln.startswith("#"):
            continue
        m = HOSTNAME.search(ln)
        if m and m.group(1) in out:
            out[m.group(1)].append(ln)
    return out


def read_metrics(entries: list[dict[str, Any]]) -> dict[str, dict[str, list[str]] | str]:
    """Every endpoint the entries name, read once and side by side (a reading): {url: {node:
    lines}}, or {url: why} for one that could not be read."""
    wanted: dict[str, set[str]] = {}
    for e in entries:
        if e["metrics_url"]:
            wanted.setdefault(e["metrics_url"], set()).add(e["node"])
    out: dict[str, dict[str, list[str]] | str] = {}
    if not wanted:
        return out

    def read(url: str) -> dict[str, list[str]] | str:
        try:
            return metrics_by_node(url, wanted[url])
        except (OSError, ValueError) as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(METRICS_WORKERS, len(wanted))) as pool:
        for url, got in zip(wanted, pool.map(read, wanted)):
            out[url] = got
    return out


def read_prometheus(p: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """{node: {query, start, end, step, series}} or {node: why}, for every node, from range
    queries of PROMETHEUS_CHUNK nodes each, side by side; nothing when no Prometheus is given."""
    if not p["prometheus_url"] or not nodes:
        return {}
    chunks = [nodes[i : i + PROMETHEUS_CHUNK] for i in range(0, len(nodes), PROMETHEUS_CHUNK)]
    window, step = max(1, p["metrics_window"]), max(1, p["metrics_step"])

    def read(chunk: list[str]) -> dict[str, Any] | str:
        try:
            return prometheus_series(p["prometheus_url"], chunk, window, step, fetch)
        except (OSError, ValueError) as exc:
            return f"{p['prometheus_url']}: {exc}"

    out: dict[str, Any] = {}
    with ThreadPoolExecutor(max_workers=min(METRICS_WORKERS, len(chunks))) as pool:
        for chunk, got in zip(chunks, pool.map(read, chunks)):
            for n in chunk:
                if isinstance(got, str):
                    out[n] = got
                else:
                    reading = {k: v for k, v in got.items() if k != "by_node"}
                    out[n] = dict(reading, series=got["by_node"].get(n, []))
    return out


def read_shared(p: dict[str, Any], entries: list[dict[str, Any]]) -> Readings:
    """The batch's sources, each read once for the nodes whose bundles are to be written."""
    nodes = [e["node"] for e in entries]
    kernel: dict[str, list[str]] | str | None = None
    if p["kernel_lines"]:
        try:
            kernel = kernel_lines(p["kernel_lines"], nodes)
        except (OSError, ValueError) as exc:
            kernel = str(exc)
    return Readings(read_metrics(entries), kernel, read_prometheus(p, nodes))


def write_file(path: str, content: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(content if content.endswith("\n") else content + "\n")


def node_sources(e: dict[str, Any], r: Readings) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """One node's files (beside summary.json), its evidence Job record and what is missing."""
    missing: list[str] = []
    lines: list[str] = []
    if e["kmsg"]:
        try:
            lines = driver_lines(e["kmsg"])
        except OSError as exc:
            missing.append(f"kmsg: {exc}")
    if isinstance(r.kernel, str):
        missing.append(f"kernel_lines: {r.kernel}")
    elif r.kernel is not None:
        lines += r.kernel.get(e["node"], [])
    metrics = r.metrics.get(e["metrics_url"]) if e["metrics_url"] else {}
    if not isinstance(metrics, dict):
        missing.append(f"metrics: {metrics or 'not read'}")
        metrics = {}
    files = {"xid_lines.txt": "\n".join(lines), "metrics.txt": "\n".join(metrics.get(e["node"], []))}
    prom = r.prometheus.get(e["node"])
    if isinstance(prom, str):
        missing.append(f"prometheus: {prom}")
    elif prom is not None:
        files["prometheus.json"] = json.dumps(prom, indent=1, sort_keys=True)
    job: dict[str, Any] = {}
    if e["report"] is not None:
        report_files, job, report_missing = node_report(e["report"])
        files.update(report_files)
        missing += report_missing
    return files, job, missing


def collect(e: dict[str, Any], bundle: str, r: Readings) -> list[str]:
    """Write the bundle's files; returns the sources that could not be read. `e` holds the node's
    sources, `xid` and `gpu`; `r` the batch's shared readings."""
    files, job, missing = node_sources(e, r)
    summary = {
        "incident": e["incident_id"],
        "node": e["node"],
        "xid": e["xid"],
        "gpu": e["gpu"],
        "gpus": e["gpus"],
        "validation": e["validation"],
        "evidence_job": job,
        "collected_at": time.time(),
        "missing": missing,
    }
    os.makedirs(bundle, mode=0o750, exist_ok=True)
    write_file(os.path.join(bundle, "summary.json"), json.dumps(summary, indent=1, sort_keys=True))
    for name, content in sorted(files.items()):
        write_file(os.path.join(bundle, name), content)
    return missing


def write_bundle(entry: dict[str, Any], bundle: str, r: Readings) -> list[str]:
    """Collect one bundle and pack it; the .tar.gz appears whole or not at all."""
    missing = collect(entry, bundle, r)
    tarball = bundle + ".tar.gz"
    tmp = tarball + ".tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(bundle, arcname=os.path.basename(bundle))
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, tarball)  # a bundle is whole or absent: the idempotence check relies on it
    return missing


def entries_of(module: Any) -> list[dict[str, Any]]:
    """One entry per node with its sources, `xid` and `gpu`, checked: node names, incident ids,
    no node twice."""
    p = module.params
    if p["nodes"] is not None:
        raw = [dict(e) for e in p["nodes"]]
        field = "nodes"
    else:
        raw = [{"node": p["node"], **{k: p[k] for k in PER_NODE}}]
        field = "node"
    if not raw:
        module.fail_json(msg="nodes: give at least one node")
    validate_nodes(module, [e["node"] for e in raw], field=field)
    names = [e["node"] for e in raw]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        module.fail_json(msg=f"nodes: {shown(twice)} given twice (one bundle per node)")
    bad = [e["incident_id"] for e in raw if not SAFE_ID.match(str(e["incident_id"]))]
    if bad:
        module.fail_json(msg=f"incident_id: {shown(bad)} not incident ids")
    return [dict(e, xid=p["xid"], gpu=p["gpu"]) for e in raw]


def run(module: Any) -> dict[str, Any]:
    p = module.params
    if not os.path.isabs(p["dir"]):
        module.fail_json(msg=f"dir: {p['dir']!r} must be an absolute path")
    if p["prometheus_url"] and not HTTP_URL.match(p["prometheus_url"]):
        module.fail_json(msg=f"prometheus_url: {p['prometheus_url'][:80]!r} is not an http(s):// URL")
    entries = entries_of(module)
    bundles: list[dict[str, Any]] = []
    todo: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for e in entries:
        bundle = os.path.join(p["dir"], f"{e['incident_id']}-{e['node']}")
        tarball = bundle + ".tar.gz"
        b = dict(node=e["node"], incident_id=e["incident_id"], path=tarball, bundle_dir=bundle, missing=[])
        b["changed"] = not os.path.exists(tarball)  # a bundle taken once is kept
        bundles.append(b)
        if b["changed"]:
            todo.append((e, b))
    if todo and not module.check_mode:
        readings = read_shared(p, [e for e, _b in todo])  # each source once, however many nodes share it
        for e, b in todo:
            b["missing"] = write_bundle(e, b["bundle_dir"], readings)
    result: dict[str, Any] = dict(
        changed=bool(todo), bundles=bundles, paths={b["node"]: b["path"] for b in bundles}
    )
    if p["nodes"] is None:
        one = bundles[0]
        result.update(path=one["path"], bundle_dir=one["bundle_dir"], missing=one["missing"])
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(),
        supports_check_mode=True,
        # a batch's entries carry their own sources
        mutually_exclusive=[("node", "nodes"), *(("nodes", k) for k in PER_NODE)],
        required_one_of=[("node", "nodes")],
    )
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
