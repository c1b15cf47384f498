# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The recovery ladder's readings, as filters: what a health check, a DCGM diagnostics Job or a
loop of reset/reboot commands said, per node. A check that could not run counts as failed: the
ladder never returns a node it could not validate (docs/runbook.md, "The recovery ladder").
Documented in the .yml file of the same name as each filter; tested in tests/runbook/test_filters.py.
"""

from __future__ import annotations

import json
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


def dcgm_result(res: Mapping[str, Any]) -> dict[str, Any]:
    """One loop item of kubernetes.core.k8s_info on a DCGM diagnostics Job."""
    jobs = res.get("resources") or []
    status = (jobs[0].get("status") or {}) if jobs else {}
    if int(status.get("succeeded") or 0) > 0:
        return {"healthy": True, "failures": []}
    why = "dcgmi diag failed" if int(status.get("failed") or 0) > 0 else "dcgmi diag did not finish in time"
    return {"healthy": False, "failures": [why]}


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
            "command_outcome": command_outcome,
            "batch_results": batch_results,
        }
