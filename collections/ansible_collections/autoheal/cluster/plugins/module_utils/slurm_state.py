# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Setting the Slurm state of a batch of nodes, shared by the slurm_node and fence modules.

`set_state` is slurm_node's whole behaviour after its arguments are checked: read the nodes, plan one
`scontrol update` per distinct set of words (reason), run them, verify. It raises StateError (with
the partial result) instead of calling fail_json, so the fence module can run it in a thread.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.autoheal.cluster.plugins.module_utils.hostlist import compress_hostlist
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import Node, Slurm
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_text

Summary = Optional[Dict[str, Any]]
Groups = Dict[Tuple[str, ...], List[str]]  # scontrol words -> the nodes that share them


class StateError(Exception):
    """A step failed; `result` is what was done up to then (returned with the failure)."""

    def __init__(self, msg: str, result: dict[str, Any]) -> None:
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result


class Want:
    """What the caller asks for: the state, its reasons (ours, prefixed) and how to verify."""

    def __init__(
        self,
        state: str,
        reason: str | None,
        per_node: dict[str, str | None],
        prefix: str,
        *,
        only_reason: str | None = None,
        comment: str | None = None,
        allow_missing: bool = False,
        verify_seconds: float = 10,
    ) -> None:
        self.state = state
        self.reason = reason
        self.per_node = per_node
        self.prefix = prefix
        self.only_reason = only_reason
        self.comment = comment
        self.allow_missing = allow_missing
        self.verify_seconds = verify_seconds

    def reason_for(self, node: str) -> str | None:
        return self.per_node.get(node, self.reason)


def build_reasons(
    module: Any, prefix: str, reason: str | None, reasons: dict[str, Any] | None, field: str = "reasons"
) -> tuple[str | None, dict[str, str | None]]:
    """(reason, {node: reason}) with our prefix added, each checked as single-line safe text."""

    def full(text: str | None, name: str) -> str | None:
        if text is None:
            return None
        if not text.startswith(prefix):
            text = prefix + text
        return validate_text(module, text, name)

    per_node = {n: full(str(t), f"{field}[{n}]") for n, t in (reasons or {}).items()}
    return full(reason, "reason"), per_node


def summary(rec: Node | None) -> Summary:
    if rec is None:
        return None
    return dict(state=rec["state"], flags=rec["flags"], reason=rec["reason"], comment=rec["comment"])


def owned(rec: Node, prefix: str) -> bool:
    reason = rec["reason"]
    return reason == "" or bool(reason.startswith(prefix.rstrip()))


def held(rec: Node) -> bool:
    return bool(rec["drained"] or rec["down"])


def _state_words(rec: Node, want: Want, reason: str | None) -> list[str] | None:
    """The scontrol words that bring the node's state where wanted; None: leave the node alone."""
    if want.state == "drain" and not (held(rec) and rec["reason"] == reason):
        return ["state=drain", f"reason={reason}"]
    if want.state == "down" and not (rec["down"] and rec["reason"] == reason):
        return ["state=down", f"reason={reason}"]
    if want.state == "resume" and held(rec):
        if want.only_reason is not None and rec["reason"] != want.only_reason:
            return None
        return ["state=resume"]
    return []


def plan(rec: Node, want: Want, node: str) -> tuple[str, list[str]]:
    """Return (action, argv-words) for one node; action in ok/change/skip."""
    if held(rec) and not owned(rec, want.prefix):
        return "skip", []
    words = _state_words(rec, want, want.reason_for(node))
    if words is None:
        return "skip", []
    if want.comment is not None and rec["comment"] != want.comment:
        words.append(f"comment={want.comment}")
    return ("change" if words else "ok"), words


def predict(rec: Node, words: list[str]) -> Node:
    """The node as it will be once `words` are applied (check mode and diff)."""
    after = dict(rec)
    flags = list(rec["flags"])
    for w in words:
        key, _sep, value = w.partition("=")
        if (key, value) == ("state", "drain") and "DRAIN" not in flags:
            flags = sorted([*flags, "DRAIN"])
        elif (key, value) == ("state", "down"):
            after["state"] = "down"
        elif (key, value) == ("state", "resume"):
            flags = [f for f in flags if f != "DRAIN"]
            after["state"] = "idle" if after["state"] == "down" else after["state"]
            after["reason"] = ""
        elif key in ("reason", "comment"):
            after[key] = value
    after.update(flags=flags, drained="DRAIN" in flags, down=after["state"] == "down")
    return after


def satisfied(rec: Node | None, want: Want, node: str) -> bool:
    if rec is None:
        return False
    if want.comment is not None and rec["comment"] != want.comment:
        return False
    reason = want.reason_for(node)
    if want.state == "drain":
        return held(rec) and rec["reason"] == reason
    if want.state == "down":
        return bool(rec["down"]) and rec["reason"] == reason
    if want.state == "keep":
        return True
    return not held(rec)


def _plan_all(
    before: dict[str, Node], nodes: list[str], want: Want, diff: bool
) -> tuple[dict[str, Any], Groups]:
    """The result skeleton and the scontrol groups {words: [nodes]} for the batch."""
    result: dict[str, Any] = dict(
        changed=False,
        changed_nodes=[],
        unchanged_nodes=[],
        skipped_nodes=[],
        missing_nodes=[],
        reason=want.reason or "",
        reasons=want.per_node,
        hostlist="",
        nodes_after={},
    )
    groups: Groups = {}
    for name in nodes:
        rec = before.get(name)
        if rec is None:
            result["missing_nodes"].append(name)
            continue
        action, words = plan(rec, want, name)
        result["nodes_after"][name] = summary(predict(rec, words) if action == "change" else rec)
        if action == "skip":
            result["skipped_nodes"].append(
                dict(node=name, state=rec["state"], flags=rec["flags"], reason=rec["reason"])
            )
        elif action == "ok":
            result["unchanged_nodes"].append(name)
        else:
            result["changed_nodes"].append(name)
            groups.setdefault(tuple(words), []).append(name)
    if result["changed_nodes"]:
        result["changed"] = True
        result["hostlist"] = compress_hostlist(result["changed_nodes"])
        if diff:
            result["diff"] = dict(
                before={n: summary(before[n]) for n in result["changed_nodes"]},
                after={n: result["nodes_after"][n] for n in result["changed_nodes"]},
            )
    return result, groups


def _apply(slurm: Slurm, groups: Groups, result: dict[str, Any]) -> None:
    """One scontrol call per group, concurrently (different reasons cannot share a call)."""
    calls = [
        ["scontrol", "update", f"nodename={compress_hostlist(names)}", *words]
        for words, names in groups.items()
    ]
    with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
        outs = list(pool.map(lambda argv: (argv, slurm.run(argv, check_rc=False)), calls))
    bad = [f"{argv[2]}: {(err or out).strip()}" for argv, (rc, out, err) in outs if rc != 0]
    if bad:
        raise StateError("scontrol failed: " + "; ".join(bad), result)


def _verify(slurm: Slurm, want: Want, result: dict[str, Any]) -> None:
    """Wait until Slurm shows the new state (slurmctld applies an update asynchronously)."""
    changed = result["changed_nodes"]
    deadline = time.time() + want.verify_seconds
    while True:
        now = slurm.nodes(changed)
        pending = [n for n in changed if not satisfied(now.get(n), want, n)]
        if not pending or time.time() >= deadline:
            break
        time.sleep(0.2)
    for n in changed:
        result["nodes_after"][n] = summary(now.get(n))
    if pending:
        raise StateError(f"Slurm did not reach state {want.state} on: {', '.join(pending)}", result)


def set_state(module: Any, slurm: Slurm, nodes: list[str], want: Want) -> dict[str, Any]:
    """Bring `nodes` to `want` (drain/down/resume/keep with their reasons); returns the result."""
    result, groups = _plan_all(slurm.nodes(nodes), nodes, want, bool(module._diff))
    result["commands"] = slurm.commands
    if groups and not module.check_mode:
        _apply(slurm, groups, result)
        _verify(slurm, want, result)
    if result["missing_nodes"] and not want.allow_missing:
        raise StateError("unknown to Slurm: " + ", ".join(result["missing_nodes"]), result)
    return result
