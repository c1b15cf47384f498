# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Setting the Slurm state of a batch of nodes, shared by the slurm_node and fence modules.

`set_state` is slurm_node's whole behaviour after its arguments are checked: read the nodes, plan one
`scontrol update` per distinct set of words (reason), run them, verify. It raises StateError (with
the partial result) instead of calling fail_json, so the fence module can run it in a thread.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import compress_hostlist, validate_text


class StateError(Exception):
    def __init__(self, msg, result):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result


def build_reasons(module, prefix, reason, reasons, field="reasons"):
    """(reason, {node: reason}) with our prefix added, each checked as single-line safe text."""

    def full(text, name):
        if text is None:
            return None
        if not text.startswith(prefix):
            text = prefix + text
        return validate_text(module, text, name)

    per_node = dict((n, full(str(t), "%s[%s]" % (field, n))) for n, t in (reasons or {}).items())
    return full(reason, "reason"), per_node


def summary(rec):
    if rec is None:
        return None
    return dict(state=rec["state"], flags=rec["flags"], reason=rec["reason"], comment=rec["comment"])


def owned(rec, prefix):
    reason = rec["reason"]
    return reason == "" or reason.startswith(prefix.rstrip())


def held(rec):
    return rec["drained"] or rec["down"]


def plan(rec, state, reason, prefix, only_reason, comment):
    """Return (action, argv-words) for one node; action in ok/change/skip."""
    words = []
    if held(rec) and not owned(rec, prefix):
        return "skip", words
    if state == "drain":
        if not (held(rec) and rec["reason"] == reason):
            words = ["state=drain", "reason=%s" % reason]
    elif state == "down":
        if not (rec["down"] and rec["reason"] == reason):
            words = ["state=down", "reason=%s" % reason]
    elif state == "resume":
        if held(rec):
            if only_reason is not None and rec["reason"] != only_reason:
                return "skip", words
            words = ["state=resume"]
    if comment is not None and rec["comment"] != comment:
        words.append("comment=%s" % comment)
    return ("change" if words else "ok"), words


def predict(rec, words):
    after = dict(rec)
    after["flags"] = list(rec["flags"])
    for w in words:
        key, _, value = w.partition("=")
        if key == "state" and value == "drain":
            if "DRAIN" not in after["flags"]:
                after["flags"] = sorted(after["flags"] + ["DRAIN"])
        elif key == "state" and value == "down":
            after["state"] = "down"
        elif key == "state" and value == "resume":
            after["flags"] = [f for f in after["flags"] if f != "DRAIN"]
            if after["state"] == "down":
                after["state"] = "idle"
            after["reason"] = ""
        elif key == "reason":
            after["reason"] = value
        elif key == "comment":
            after["comment"] = value
    after["drained"] = "DRAIN" in after["flags"]
    after["down"] = after["state"] == "down"
    return after


def satisfied(rec, state, reason, comment):
    if rec is None:
        return False
    if comment is not None and rec["comment"] != comment:
        return False
    if state == "drain":
        return held(rec) and rec["reason"] == reason
    if state == "down":
        return rec["down"] and rec["reason"] == reason
    if state == "keep":
        return True
    return not held(rec)


def set_state(module, slurm, nodes, state, reason, per_node, prefix, only_reason, comment, allow_missing,
              verify_seconds):
    """Bring `nodes` to `state` (drain/down/resume/keep) with their reasons; returns the result."""
    before = slurm.nodes(nodes)

    result = dict(changed=False, changed_nodes=[], unchanged_nodes=[], skipped_nodes=[],
                  missing_nodes=[], reason=reason or "", reasons=per_node, hostlist="", nodes_after={},
                  commands=slurm.commands)
    groups = {}
    for name in nodes:
        rec = before.get(name)
        if rec is None:
            result["missing_nodes"].append(name)
            continue
        action, words = plan(rec, state, per_node.get(name, reason), prefix, only_reason, comment)
        if action == "skip":
            result["skipped_nodes"].append(dict(node=name, state=rec["state"], flags=rec["flags"],
                                                reason=rec["reason"]))
            result["nodes_after"][name] = summary(rec)
        elif action == "ok":
            result["unchanged_nodes"].append(name)
            result["nodes_after"][name] = summary(rec)
        else:
            result["changed_nodes"].append(name)
            groups.setdefault(tuple(words), []).append(name)
            result["nodes_after"][name] = summary(predict(rec, words))

    if result["changed_nodes"]:
        result["changed"] = True
        result["hostlist"] = compress_hostlist(result["changed_nodes"])
        if module._diff:
            result["diff"] = dict(
                before=dict((n, summary(before[n])) for n in result["changed_nodes"]),
                after=dict((n, result["nodes_after"][n]) for n in result["changed_nodes"]),
            )

    if result["changed_nodes"] and not module.check_mode:
        calls = [["scontrol", "update", "nodename=%s" % compress_hostlist(names)] + list(words)
                 for words, names in groups.items()]
        with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
            outs = list(pool.map(lambda argv: (argv, slurm.run(argv, check_rc=False)), calls))
        bad = [(argv, r) for argv, r in outs if r[0] != 0]
        if bad:
            raise StateError("scontrol failed: %s" % "; ".join(
                "%s: %s" % (argv[2], (r[2] or r[1]).strip()) for argv, r in bad), result)
        deadline = time.time() + verify_seconds
        while True:
            now = slurm.nodes(result["changed_nodes"])
            pending = [n for n in result["changed_nodes"]
                       if not satisfied(now.get(n), state, per_node.get(n, reason), comment)]
            if not pending or time.time() >= deadline:
                break
            time.sleep(0.2)
        for n in result["changed_nodes"]:
            result["nodes_after"][n] = summary(now.get(n))
        if pending:
            raise StateError("Slurm did not reach state %s on: %s" % (state, ", ".join(pending)), result)

    if result["missing_nodes"] and not allow_missing:
        raise StateError("unknown to Slurm: %s" % ", ".join(result["missing_nodes"]), result)
    return result
