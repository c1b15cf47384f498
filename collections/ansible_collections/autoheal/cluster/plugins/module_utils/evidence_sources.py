# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The evidence module's production sources, read and bounded here (tests/runbook/test_evidence_sources.py):

- the watcher's kernel lines, a JSON file the runner writes per run ({"nodes": {node: [line]}});
- the node's own report, the logs of the evidence Job (autoheal.cluster.node_job) cut into the
  sections the Job's script marks (nvidia-smi -q, dcgmi health -c -j);
- the node's last GPU metrics from Prometheus (a range query of the DCGM_FI_DEV_* series).

All of it is text from elsewhere (a kernel log, a node, a metrics store): it is kept to printable
ASCII and bounded in size, and it only ever lands in the bundle's files.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Iterable, Mapping

MAX_LINE = 512  # characters of one kernel line
MAX_LINES = 500  # kernel lines of one node
MAX_LINES_FILE = 4 << 20  # bytes of the runner's kernel-lines file
MAX_REPORT = 1 << 20  # characters of one node's Job logs
MAX_PROMETHEUS = 8 << 20  # bytes of one Prometheus answer
PROMETHEUS_CHUNK = 25  # nodes per Prometheus query (a storm's batch: a few queries side by side)
MARK = "### autoheal-evidence "
# the Job script's sections -> the bundle's files (roles/ladder/tasks/evidence.yml prints them)
SECTIONS = {"nvidia-smi -q": "nvidia_smi_q.txt", "dcgmi health -c -j": "dcgm_health.json"}
RC = re.compile(r"^rc=(-?[0-9]{1,3})$")
Fetch = Callable[[str, Mapping[str, str]], bytes]


def printable(text: str, limit: int, newlines: bool = False) -> str:
    """Printable ASCII (tabs and newlines too when `newlines`), at most `limit` characters."""
    keep = "\n\t" if newlines else ""
    out = "".join(c if " " <= c <= "~" or c in keep else "?" for c in text[:limit])
    return out if len(text) <= limit else out + f"\n[cut at {limit} characters]"


def kernel_lines(path: str, nodes: Iterable[str]) -> dict[str, list[str]]:
    """Each node's kernel lines from the runner's file; raises OSError or ValueError (with why)
    when the file cannot be read or is not the runner's shape."""
    with open(path, "rb") as fh:
        raw = fh.read(MAX_LINES_FILE + 1)
    if len(raw) > MAX_LINES_FILE:
        raise ValueError(f"{path}: larger than {MAX_LINES_FILE} bytes")
    data = json.loads(raw.decode("utf-8", errors="replace"))
    by_node = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(by_node, dict):
        raise ValueError(f'{path}: not {{"nodes": {{node: [line]}}}}')
    out: dict[str, list[str]] = {}
    for node in nodes:
        lines = by_node.get(node)
        lines = lines if isinstance(lines, list) else []
        out[node] = [printable(str(ln), MAX_LINE).replace("\n", " ") for ln in lines[-MAX_LINES:]]
    return out


def split_report(logs: str) -> tuple[dict[str, str], dict[str, int | None]]:
    """The Job's logs cut into its sections: ({file: text}, {section: exit code or None when the
    section never ended - the Job was cut short})."""
    files: dict[str, str] = {}
    codes: dict[str, int | None] = {}
    current: str | None = None
    body: list[str] = []
    for line in logs.splitlines():
        if not line.startswith(MARK):
            if current is not None:
                body.append(line)
            continue
        rest = line[len(MARK) :].strip()
        m = RC.match(rest)
        if m and current is not None:
            codes[current] = int(m.group(1))
        elif rest in SECTIONS:
            codes[rest] = None
        else:
            continue
        if current is not None:
            files[SECTIONS[current]] = "\n".join(body)
        current, body = (rest, []) if rest in SECTIONS else (None, [])
    if current is not None:
        files[SECTIONS[current]] = "\n".join(body)
    return files, codes


def node_report(result: Any) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """A node's evidence Job (one entry of node_job's `node_results`): the bundle's files, the summary's
    record of the Job and what is missing (with the Job's reason)."""
    if not isinstance(result, Mapping):
        return {}, {"ran": False}, ["node_report: no evidence Job result for this node"]
    logs = printable(str(result.get("logs") or ""), MAX_REPORT, newlines=True)
    files, codes = split_report(logs)
    record = {
        "ran": True,
        "ok": bool(result.get("ok")),
        "exit_code": result.get("exit_code") if isinstance(result.get("exit_code"), int) else None,
        "reason": printable(str(result.get("reason") or ""), 300),
        "job": printable(str(result.get("job") or ""), 253),
        "sections": codes,
    }
    missing = []
    if not record["ok"]:
        missing.append(f"node_report: the evidence Job failed: {record['reason'] or 'no reason given'}")
    for name in SECTIONS:
        if name not in codes:
            missing.append(f"{name}: not in the Job's output")
        elif codes[name] != 0:
            rc = codes[name]
            missing.append(f"{name}: " + ("cut short" if rc is None else f"exit code {rc}"))
    if not files and logs:
        files["node_job.log"] = logs  # a Job that never reached the script (an image without sh)
    return files, record, missing


def prometheus_query(nodes: list[str]) -> str:
    """The node's DCGM series (every GPU of it): node names are DNS names, only dots need escaping."""
    alternatives = "|".join(n.replace(".", "\\\\.") for n in nodes)
    return '{__name__=~"DCGM_FI_DEV_.+",Hostname=~"' + alternatives + '"}'


def prometheus_series(
    url: str, nodes: list[str], window: int, step: int, fetch: Fetch, now: float | None = None
) -> dict[str, Any]:
    """One range query for `nodes` over the last `window` seconds: {"query", "start", "end",
    "step", "by_node": {node: [series]}}; raises OSError or ValueError with why."""
    from urllib.parse import urlencode

    end = time.time() if now is None else now
    query = prometheus_query(nodes)
    params = {"query": query, "start": f"{end - window:.3f}", "end": f"{end:.3f}", "step": str(step)}
    raw = fetch(url.rstrip("/") + "/api/v1/query_range?" + urlencode(params), {"Accept": "application/json"})
    if len(raw) > MAX_PROMETHEUS:
        raise ValueError(f"Prometheus answered more than {MAX_PROMETHEUS} bytes")
    data = json.loads(raw.decode("utf-8", errors="replace"))
    if not isinstance(data, dict) or data.get("status") != "success":
        why = data.get("error") if isinstance(data, dict) else None
        raise ValueError(f"Prometheus: {printable(str(why or 'not a query answer'), 200)}")
    by_node: dict[str, list[Any]] = {n: [] for n in nodes}
    for series in (data.get("data") or {}).get("result") or []:
        host = (series.get("metric") or {}).get("Hostname") if isinstance(series, dict) else None
        if host in by_node:
            by_node[host].append(series)
    return {"query": query, "start": end - window, "end": end, "step": step, "by_node": by_node}
