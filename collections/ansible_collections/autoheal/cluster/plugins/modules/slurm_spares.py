#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_spares
short_description: Promote one hot spare of the same pool for each failed Slurm node
description:
  - >-
    A hot spare is a Slurm node of the pool that is drained with exactly O(spare_reason), responding
    and not down. For each failed node the module picks one (in natural name order, restricted to
    O(candidates) when given), marks it with the node comment
    C(autoheal: replaces <failed node> <incident>) and resumes all picked spares with one
    C(scontrol update) call, so requeued jobs can start there at once.
  - The comment is the record that makes the module idempotent - a failed node that already has a
    spare whose comment names it is reported as C(already) and no second spare is promoted, whatever
    the incident (a new incident for the same outage must not take a second spare). The record
    stands until the failed node returns to service; the node_pool role's C(forget_promotions)
    clears it then, so a later failure gets a new spare. A spare marked but still drained (an
    interrupted run) is resumed.
  - The pool of a failed node comes from its C(pool_<name>) feature, or from O(pool).
  - When there are fewer spares than failed nodes the rest are reported in RV(shortfall).
  - >-
    Concurrent runs (a storm split into batches) would read the same free spares and race to resume
    them; picking, marking and resuming therefore happen under an exclusive lock on O(lock_file),
    held until the module exits (released by the kernel if it dies). Runs on other hosts are not
    covered - one runner per cluster.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  incident_ids:
    description: Incident ids parallel to O(nodes), written into the spare's comment.
    type: list
    elements: str
    default: []
  pool:
    description: Pool name (feature C(pool_<pool>)); default is each failed node's own pool feature.
    type: str
  candidates:
    description: Only these nodes may be promoted (e.g. nodes Kubernetes also marks as spares).
    type: list
    elements: str
  spare_reason:
    description: The drain reason that marks a hot spare.
    type: str
    default: "autoheal: hot spare"
  comment_prefix:
    description: Prefix of the comment that records a promotion.
    type: str
    default: "autoheal: replaces "
  state:
    description: C(promoted) promotes; C(query) only reports existing promotions and free spares.
    type: str
    default: promoted
    choices: [promoted, query]
  lock_file:
    description:
      - File locked while spares are picked and resumed.
      - Default is C(autoheal-spares-<hash of slurm_conf>.lock) in the system temporary directory.
    type: path
  lock_timeout:
    description: Seconds to wait for the lock before failing.
    type: int
    default: 120
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.diff
  - autoheal.cluster.nodes
  - autoheal.cluster.slurm
"""

EXAMPLES = r"""
- name: Promote a spare for each failed node
  autoheal.cluster.slurm_spares:
    nodes: [gpu-3]
    incident_ids: [inc-42]
  register: promo   # promo.promotions == [{node: gpu-3, spare: gpu-5, status: promoted, ...}]
"""

RETURN = r"""
promotions:
  description: One entry per failed node - its spare and C(status) (promoted, already, none).
  returned: always
  type: list
  elements: dict
  sample: [{node: gpu-3, spare: gpu-5, incident: inc-42, pool: h100, status: promoted}]
promoted_spares:
  description: Spares resumed by this run (would be, in check mode).
  returned: always
  type: list
  elements: str
spares:
  description: Every spare now assigned to the failed nodes (new and earlier promotions).
  returned: always
  type: list
  elements: str
shortfall:
  description: Failed nodes for which no spare was available.
  returned: always
  type: list
  elements: str
free_spares:
  description: Spares still free after this run, per pool.
  returned: always
  type: dict
not_free:
  description: >-
    Why each candidate spare was not free (not drained as a spare, down, not responding, already
    promoted).
  returned: always
  type: dict
  sample: {gpu-6: "down or not responding (idle+DRAIN+NOT_RESPONDING)"}
replaces:
  description: "Every assigned spare and the failed node it stands in for, C({spare: node})."
  returned: always
  type: dict
  sample: {gpu-5: gpu-3}
"""

import fcntl
import hashlib
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import SPARE_REASON
from ansible_collections.autoheal.cluster.plugins.module_utils.hostlist import compress_hostlist
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    DEFAULT_PREFIX,
    SLURM_COMMON_ARGS,
    Node,
    Slurm,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes, validate_text

COMMENT_PREFIX = DEFAULT_PREFIX + "replaces "
_HELD: list[IO[str]] = []  # the lock's file stays open (locked) until the module's process exits


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        incident_ids=dict(type="list", elements="str", default=[]),
        pool=dict(type="str"),
        candidates=dict(type="list", elements="str"),
        spare_reason=dict(type="str", default=SPARE_REASON),
        comment_prefix=dict(type="str", default=COMMENT_PREFIX),
        state=dict(type="str", default="promoted", choices=["promoted", "query"]),
        lock_file=dict(type="path"),
        lock_timeout=dict(type="int", default=120),
    )
    spec.update(SLURM_COMMON_ARGS)
    return spec


def natural(name: str) -> list[int | str]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def pool_of(rec: Node) -> str | None:
    return next((f[5:] for f in rec["features"] if f.startswith("pool_")), None)


def take_lock(module: Any, path: str, timeout: int) -> None:
    """Hold an exclusive flock on `path` until the process exits; fail after `timeout` seconds."""
    fh = open(path, "a")  # noqa: SIM115 - kept open on purpose: closing it would release the lock
    deadline = time.time() + timeout
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _HELD.append(fh)
            return
        except OSError:
            if time.time() >= deadline:
                module.fail_json(msg=f"another run holds the spare lock {path} (waited {timeout}s)")
            time.sleep(0.05)


def default_lock(slurm_conf: str | None) -> str:
    key = hashlib.sha256((slurm_conf or os.environ.get("SLURM_CONF") or "default").encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"autoheal-spares-{key}.lock")


class Picker:
    """Which spare each failed node gets. The node comment records a promotion, so a rerun finds
    the spare it picked before and promotes nothing new."""

    def __init__(self, allnodes: dict[str, Node], p: dict[str, Any], candidates: list[str] | None) -> None:
        self.allnodes = allnodes
        self.p = p
        self.candidates = candidates
        self.to_mark: list[tuple[str, str]] = []  # (spare, comment)
        self.to_resume: list[str] = []

    def marker(self, bad: str, incident: str) -> str:
        return f"{self.p['comment_prefix']}{bad} {incident}".strip()

    def is_marked_for(self, rec: Node, bad: str) -> bool:
        # Any incident's record counts: it stands while `bad` is out of service (returning a node
        # clears the records naming it, node_pool's forget_promotions), so a new incident for the
        # same outage - the alert fired again after the dedup window - promotes no second spare.
        c = rec["comment"]
        return bool(c == self.marker(bad, "") or c.startswith(self.marker(bad, "") + " "))

    def not_free(self, rec: Node) -> str:
        """Why a node is not a free hot spare ("" when it is one)."""
        if self.candidates is not None and rec["name"] not in self.candidates:
            return "not a ready, schedulable spare in Kubernetes"
        if not rec["drained"] or rec["reason"] != self.p["spare_reason"]:
            return f"not drained as a spare (state {rec['state']}, reason {rec['reason']!r})"
        if rec["down"] or not rec["responding"]:
            return f"down or not responding ({rec['state']}+{'+'.join(rec['flags'])})"
        if rec["comment"].startswith(self.p["comment_prefix"]):
            return f"already promoted ({rec['comment']})"
        return ""

    def is_free_spare(self, rec: Node) -> bool:
        return not self.not_free(rec)

    def existing(self, entry: dict[str, Any]) -> bool:
        """An earlier run's spare for this node (this outage); resumed again if still drained."""
        marked = [n for n, r in self.allnodes.items() if self.is_marked_for(r, entry["node"])]
        if not marked:
            return False
        spare = sorted(marked, key=natural)[0]
        srec = self.allnodes[spare]
        resumed = not (srec["drained"] and srec["reason"] == self.p["spare_reason"])
        if not resumed:
            self.to_resume.append(spare)  # marked by an interrupted run, not yet resumed
        entry.update(spare=spare, status="already" if resumed else "promoted")
        return True

    def pick(self, entry: dict[str, Any], free: list[str]) -> None:
        for cand in free:
            if pool_of(self.allnodes[cand]) == entry["pool"]:
                free.remove(cand)
                self.to_mark.append((cand, self.marker(entry["node"], entry["incident"])))
                self.to_resume.append(cand)
                entry.update(spare=cand, status="promoted")
                return

    def promotions(self, failed: list[str], incidents: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """One entry per failed node (its spare and status), and the spares still free."""
        free = sorted(
            (n for n, r in self.allnodes.items() if self.is_free_spare(r) and n not in failed), key=natural
        )
        out = []
        for idx, bad in enumerate(failed):
            rec = self.allnodes.get(bad)
            entry = dict(
                node=bad, incident=incidents[idx] if idx < len(incidents) else "", spare=None, status="none"
            )
            entry["pool"] = self.p["pool"] or (pool_of(rec) if rec else None)
            if not self.existing(entry) and entry["pool"] is not None:
                self.pick(entry, free)
            out.append(entry)
        return out, free


def not_free(picker: Picker) -> dict[str, str]:
    """Why each Kubernetes spare (each drained node without Kubernetes) is not a free spare."""
    seen = (
        picker.candidates
        if picker.candidates is not None
        else [n for n, r in picker.allnodes.items() if r["drained"]]
    )
    out = {}
    for n in seen:
        rec = picker.allnodes.get(n)
        why = picker.not_free(rec) if rec is not None else "not a Slurm node"
        if why:
            out[n] = why
    return out


def build_result(
    slurm: Slurm, picker: Picker, promotions: list[dict[str, Any]], free: list[str]
) -> dict[str, Any]:
    free_by_pool: dict[str, list[str]] = {}
    for n in free:
        free_by_pool.setdefault(pool_of(picker.allnodes[n]) or "", []).append(n)
    promoting = picker.p["state"] == "promoted"
    return dict(
        changed=bool(picker.to_resume) and promoting,
        promotions=promotions,
        promoted_spares=picker.to_resume if promoting else [],
        spares=[e["spare"] for e in promotions if e["spare"]],
        replaces={e["spare"]: e["node"] for e in promotions if e["spare"]},
        shortfall=[e["node"] for e in promotions if e["status"] == "none"],
        free_spares=free_by_pool,
        # why each Kubernetes spare (or each drained node) is not free: a shortfall explains itself
        not_free=not_free(picker),
        commands=slurm.commands,
    )


def promotion_diff(picker: Picker) -> dict[str, Any]:
    nodes, comments = picker.allnodes, dict(picker.to_mark)

    def after(n: str) -> dict[str, Any]:
        flags = [f for f in nodes[n]["flags"] if f != "DRAIN"]
        return dict(flags=flags, reason="", comment=comments.get(n, nodes[n]["comment"]))

    return dict(
        before={
            n: dict(flags=nodes[n]["flags"], reason=nodes[n]["reason"], comment=nodes[n]["comment"])
            for n in picker.to_resume
        },
        after={n: after(n) for n in picker.to_resume},
    )


def promote(module: Any, slurm: Slurm, picker: Picker, result: dict[str, Any]) -> None:
    """Mark the spares (comment first: an interrupted run finds them assigned), then resume them
    with one call and wait until Slurm shows them resumed."""
    calls = [
        ["scontrol", "update", f"nodename={spare}", f"comment={comment}"] for spare, comment in picker.to_mark
    ]
    if calls:  # each comment differs: one call per spare, concurrently for a batch
        with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
            outs = list(pool.map(lambda argv: (argv, slurm.run(argv, check_rc=False)), calls))
        bad = [f"{argv[2]}: {(err or out).strip()}" for argv, (rc, out, err) in outs if rc != 0]
        if bad:
            module.fail_json(msg="setting the spare comment failed: " + "; ".join(bad), **result)
    slurm.run(["scontrol", "update", f"nodename={compress_hostlist(picker.to_resume)}", "state=resume"])
    deadline = time.time() + 10
    while True:
        now = slurm.nodes(picker.to_resume)
        pending = [n for n in picker.to_resume if now.get(n, {}).get("drained", True)]
        if not pending or time.time() > deadline:
            break
        time.sleep(0.2)
    if pending:
        module.fail_json(msg="spares did not resume: " + ", ".join(pending), **result)


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    failed = validate_nodes(module, p["nodes"])
    incidents = [str(validate_text(module, i, "incident_ids")) for i in p["incident_ids"]]
    candidates = (
        validate_nodes(module, p["candidates"], "candidates") if p["candidates"] is not None else None
    )
    slurm = Slurm(module)
    if p["state"] == "promoted" and not module.check_mode:
        take_lock(module, p["lock_file"] or default_lock(p["slurm_conf"]), p["lock_timeout"])
    picker = Picker(slurm.nodes(), p, candidates)
    promotions, free = picker.promotions(failed, incidents)
    result = build_result(slurm, picker, promotions, free)
    if result["changed"] and module._diff:
        result["diff"] = promotion_diff(picker)
    for _spare, comment in picker.to_mark:
        validate_text(module, comment, "comment")
    if p["state"] == "promoted" and not module.check_mode and picker.to_resume:
        promote(module, slurm, picker, result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
