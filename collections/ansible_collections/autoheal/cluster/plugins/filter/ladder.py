# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The recovery ladder's readings, as filters: what a health check, a DCGM diagnostics Job or a
loop of reset/reboot commands said, per node. A check that could not run counts as failed: the
ladder never returns a node it could not validate (docs/runbook.md, "The recovery ladder").
Documented in the .yml file of the same name as each filter; tested in tests/runbook/test_filters.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any


def _why(res: Mapping[str, Any]) -> str:
    text = str(res.get("stderr") or res.get("msg") or "failed").strip()
    return " ".join(text.split())[:300]


def health_result(res: Mapping[str, Any]) -> dict[str, Any]:
    """One loop item of `autoheal lab pool health`: its JSON, or unhealthy naming why it did not run."""
    if res.get("rc") == 0:
        try:
            data = json.loads(str(res.get("stdout") or ""))
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("healthy"), bool):
            data.setdefault("failures", [])
            return data
    return {"healthy": False, "failures": [f"health check did not run: {_why(res)}"]}


# a line that can be part of a JSON document printed one value per line (pretty or compact)
_JSON_LINE = re.compile(r'^\s*(?:[\[\]{}",:]|-?\d|true\b|false\b|null\b|$)')


def _diag_json(logs: str) -> Any:
    """The JSON document `dcgmi diag -j` printed, or None. The pod's log merges stdout and
    stderr line by line in no guaranteed order, so a line dcgmi wrote to stderr (a warning) can
    land before the document or inside it: then the document is read without the lines that
    cannot belong to it."""
    start, end = logs.find("{"), logs.rfind("}")
    if start < 0 or end < start:
        return None
    span = logs[start : end + 1]
    for text in (span, "\n".join(line for line in span.splitlines() if _JSON_LINE.match(line))):
        try:
            return json.loads(text)
        except ValueError:
            continue
    return None


def _diag_failures(doc: Any) -> list[str] | None:
    """The tests that failed in a `dcgmi diag -j` document ("DCGM GPU Diagnostic" > test_categories
    > tests > results, each with gpu_ids and status Pass|Fail|Warn|Skip); None when it has no results."""
    root = doc.get("DCGM GPU Diagnostic") if isinstance(doc, dict) else None
    cats = root.get("test_categories") if isinstance(root, dict) else None
    if not isinstance(cats, list):
        return None
    failed, seen = [], 0
    for cat in cats:
        for test in (cat or {}).get("tests") or [] if isinstance(cat, dict) else []:
            for res in (test or {}).get("results") or [] if isinstance(test, dict) else []:
                seen += 1
                if isinstance(res, dict) and str(res.get("status", "")).lower().startswith("fail"):
                    warn = "; ".join(str(w) for w in res.get("warnings") or [])
                    failed.append(
                        f"{test.get('name')} on GPU {res.get('gpu_ids')}: Fail"
                        + (f" ({warn})" if warn else "")
                    )
    return failed if seen else None


def dcgm_result(res: Mapping[str, Any] | str) -> dict[str, Any]:
    """One node's result of the DCGM diagnostics Job (autoheal.cluster.node_job: ok, exit_code,
    reason, logs). Healthy only when the Job completed, exit 0, AND its `dcgmi diag -j` document
    lists results none of which failed: a diagnostic that printed no result never passes."""
    if isinstance(res, str):  # why the Job never ran (refused, holders left): unhealthy, naming it
        return {"healthy": False, "failures": [res]}
    doc = _diag_json(str(res.get("logs") or ""))
    tests = _diag_failures(doc)
    if res.get("ok") and tests == []:
        return {"healthy": True, "failures": []}
    failures = [] if res.get("ok") else [f"dcgmi diag: {res.get('reason') or 'did not run'}"]
    if tests:  # the failed tests say more than the output's last line
        code = res.get("exit_code")
        failures = ([] if res.get("ok") else [f"dcgmi diag exited {code}"]) + tests
    elif res.get("ok"):
        failures.append("dcgmi diag exited 0 but printed no test results (dcgmi diag -j)")
    return {"healthy": False, "failures": failures}


def holders_outcome(
    holders: Mapping[str, Any], nodes: Iterable[str], left: Mapping[str, Any], label: str
) -> dict[str, Any]:
    """gpu_holders before and after the GPU agents were stopped: the nodes free of every holder,
    and {node: why} for the others - refused for a pod not autoheal's (named), failed for agents
    that did not go or a node that could not be read."""
    failed: dict[str, str] = {}
    for source in (holders, left or {}):
        for node, pods in (source.get("users") or {}).items():
            failed[node] = f"refused: the GPUs are in use by {', '.join(pods)}, not autoheal's to stop"
        for node, why in (source.get("failed") or {}).items():
            failed.setdefault(node, str(why))
    for node, pods in ((left or {}).get("agents") or {}).items():
        failed.setdefault(
            node,
            f"GPU agents still running: {', '.join(pods)} (does their DaemonSet exclude {label}=stopped?)",
        )
    return {"free": [n for n in nodes if n not in failed], "failed": failed}


def reset_scope(
    infos: Mapping[str, Any], nodes: Iterable[str], scope: str, gpu: Any, nvswitch: str
) -> dict[str, list[str]]:
    """Which nodes reset every GPU together (`all`) and which only `gpu` (`one`). auto: one GPU
    only when a GPU is named and the node's product label (nvidia.com/gpu.product, from GPU
    feature discovery) is known and not an NVSwitch baseboard (matching `nvswitch`); NVIDIA resets
    the GPUs of an NVSwitch system together (docs/runbook.md, "The recovery ladder")."""
    out: dict[str, list[str]] = {"all": [], "one": []}
    for node in nodes:
        labels = ((infos.get(node) or {}).get("labels") or {}) if isinstance(infos, Mapping) else {}
        product = str(labels.get("nvidia.com/gpu.product") or "")
        single = gpu is not None and (
            scope == "gpu" or (scope == "auto" and product and not re.search(nvswitch, product))
        )
        out["one" if single else "all"].append(node)
    return out


def command_outcome(results: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A loop of commands or Jobs, one per node (`item`): the nodes it worked for, and
    {node: why} for the others. Skipped items count for neither."""
    ran = [r for r in results or [] if not r.get("skipped")]
    ok = [str(r["item"]) for r in ran if r.get("rc", 0) == 0 and not r.get("failed")]
    return {"ok": ok, "failed": {str(r["item"]): _why(r) for r in ran if str(r["item"]) not in ok}}


def batch_results(res: Mapping[str, Any], nodes: Iterable[str]) -> list[dict[str, Any]]:
    """One batch call of `autoheal lab pool ... --nodes A,B` as the results of a loop of single
    calls ({item, rc, stdout, stderr} per node), so health_result and command_outcome read both.
    A batch that did not run, or a node it did not answer for, is a failed item naming why."""
    wanted = [str(n) for n in nodes or []]
    if res.get("skipped"):
        return [{"item": n, "skipped": True} for n in wanted]
    items: dict[str, dict[str, Any]] = {}
    if res.get("rc") == 0:
        try:
            data = json.loads(str(res.get("stdout") or ""))
        except ValueError:
            data = None
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and str(entry.get("item")) in wanted:
                items[str(entry["item"])] = {
                    "item": str(entry["item"]),
                    "rc": int(entry.get("rc", 1)),
                    "stdout": str(entry.get("stdout") or ""),
                    "stderr": str(entry.get("stderr") or ""),
                }
    why = _why(res) if res.get("rc") != 0 else "no result for this node in the batch's output"
    return [items.get(n) or {"item": n, "rc": 1, "stdout": "", "stderr": why} for n in wanted]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "health_result": health_result,
            "dcgm_result": dcgm_result,
            "holders_outcome": holders_outcome,
            "reset_scope": reset_scope,
            "command_outcome": command_outcome,
            "batch_results": batch_results,
        }
