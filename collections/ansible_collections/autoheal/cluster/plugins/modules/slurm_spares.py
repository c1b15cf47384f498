#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

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
    spare whose comment names it (and its incident, when O(incident_ids) is given) is reported as
    C(already) and no second spare is promoted. A spare marked but still drained (an interrupted
    run) is resumed.
  - The pool of a failed node comes from its C(pool_<name>) feature, or from O(pool).
  - When there are fewer spares than failed nodes the rest are reported in RV(shortfall).
  - >-
    Concurrent runs (a storm split into batches) would read the same free spares and race to resume
    them; picking, marking and resuming therefore happen under an exclusive lock on O(lock_file),
    held until the module exits (released by the kernel if it dies). Runs on other hosts are not
    covered - one runner per cluster.
version_added: 0.1.0
author: autoheal maintainers
extends_documentation_fragment:
  - autoheal.cluster.slurm
options:
  nodes:
    description: Failed node names.
    type: list
    elements: str
    required: true
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
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
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
"""

import fcntl
import hashlib
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    SLURM_COMMON_ARGS,
    Slurm,
    compress_hostlist,
    validate_nodes,
    validate_text,
)


def natural(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def pool_of(rec):
    for f in rec["features"]:
        if f.startswith("pool_"):
            return f[5:]
    return None


_HELD = []  # the lock's file stays open (locked) until the module's process exits


def take_lock(module, path, timeout):
    """Hold an exclusive flock on `path` until the process exits; fail after `timeout` seconds."""
    fh = open(path, "a")
    deadline = time.time() + timeout
    while True:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _HELD.append(fh)
            return
        except (BlockingIOError, OSError):
            if time.time() >= deadline:
                module.fail_json(msg="another run holds the spare lock %s (waited %ss)" % (path, timeout))
            time.sleep(0.05)


def default_lock(slurm_conf):
    key = hashlib.sha1((slurm_conf or os.environ.get("SLURM_CONF") or "default").encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "autoheal-spares-%s.lock" % key)


def main():
    argument_spec = dict(
        nodes=dict(type="list", elements="str", required=True),
        incident_ids=dict(type="list", elements="str", default=[]),
        pool=dict(type="str"),
        candidates=dict(type="list", elements="str"),
        spare_reason=dict(type="str", default="autoheal: hot spare"),
        comment_prefix=dict(type="str", default="autoheal: replaces "),
        state=dict(type="str", default="promoted", choices=["promoted", "query"]),
        lock_file=dict(type="path"),
        lock_timeout=dict(type="int", default=120),
    )
    argument_spec.update(SLURM_COMMON_ARGS)
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    p = module.params
    failed = validate_nodes(module, p["nodes"])
    incidents = list(p["incident_ids"])
    for i in incidents:
        validate_text(module, i, "incident_ids")
    candidates = validate_nodes(module, p["candidates"], "candidates") if p["candidates"] is not None else None
    prefix = p["comment_prefix"]

    slurm = Slurm(module)
    if p["state"] == "promoted" and not module.check_mode:
        take_lock(module, p["lock_file"] or default_lock(p["slurm_conf"]), p["lock_timeout"])
    allnodes = slurm.nodes()

    def marker(bad, incident):
        return (prefix + bad + " " + incident).strip()

    def is_marked_for(rec, bad, incident):
        # With an incident id only a promotion for that incident counts: a node that fails again
        # later (a new incident) gets a new spare.
        c = rec["comment"]
        if incident:
            return c == marker(bad, incident)
        return c == marker(bad, "") or c.startswith(marker(bad, "") + " ")

    def is_free_spare(rec):
        return (rec["drained"] and not rec["down"] and rec["responding"]
                and rec["reason"] == p["spare_reason"] and not rec["comment"].startswith(prefix)
                and (candidates is None or rec["name"] in candidates))

    free = sorted((n for n, r in allnodes.items() if is_free_spare(r) and n not in failed), key=natural)
    promotions, to_mark, to_resume = [], [], []
    for idx, bad in enumerate(failed):
        incident = incidents[idx] if idx < len(incidents) else ""
        rec = allnodes.get(bad)
        pool = p["pool"] or (pool_of(rec) if rec else None)
        entry = dict(node=bad, incident=incident, pool=pool, spare=None, status="none")
        existing = [n for n, r in allnodes.items() if is_marked_for(r, bad, incident)]
        if existing:
            spare = sorted(existing, key=natural)[0]
            entry.update(spare=spare, status="already")
            srec = allnodes[spare]
            if srec["drained"] and srec["reason"] == p["spare_reason"]:
                to_resume.append(spare)  # marked by an interrupted run, not yet resumed
                entry["status"] = "promoted"
        elif pool is not None:
            for cand in free:
                if pool_of(allnodes[cand]) == pool:
                    free.remove(cand)
                    comment = marker(bad, incident)
                    validate_text(module, comment, "comment")
                    to_mark.append((cand, comment))
                    to_resume.append(cand)
                    entry.update(spare=cand, status="promoted")
                    break
        promotions.append(entry)

    free_by_pool = {}
    for n in free:
        free_by_pool.setdefault(pool_of(allnodes[n]) or "", []).append(n)
    result = dict(
        changed=bool(to_resume) and p["state"] == "promoted",
        promotions=promotions,
        promoted_spares=to_resume if p["state"] == "promoted" else [],
        spares=[e["spare"] for e in promotions if e["spare"]],
        shortfall=[e["node"] for e in promotions if e["status"] == "none"],
        free_spares=free_by_pool,
        commands=slurm.commands,
    )
    if result["changed"] and module._diff:
        result["diff"] = dict(
            before=dict((n, dict(flags=allnodes[n]["flags"], reason=allnodes[n]["reason"],
                                 comment=allnodes[n]["comment"])) for n in to_resume),
            after=dict((n, dict(flags=[f for f in allnodes[n]["flags"] if f != "DRAIN"], reason="",
                                comment=dict(to_mark).get(n, allnodes[n]["comment"]))) for n in to_resume),
        )
    if p["state"] == "query" or module.check_mode or not to_resume:
        module.exit_json(**result)

    # The comment first: if we are interrupted, the next run finds the spare already assigned.
    # (one call per spare, each comment differs; run concurrently for a batch)
    calls = [["scontrol", "update", "nodename=%s" % spare, "comment=%s" % comment] for spare, comment in to_mark]
    if calls:
        with ThreadPoolExecutor(max_workers=min(8, len(calls))) as pool:
            outs = list(pool.map(lambda argv: (argv, slurm.run(argv, check_rc=False)), calls))
        bad = [(argv, r) for argv, r in outs if r[0] != 0]
        if bad:
            module.fail_json(msg="setting the spare comment failed: %s" % "; ".join(
                "%s: %s" % (argv[2], (r[2] or r[1]).strip()) for argv, r in bad), **result)
    slurm.run(["scontrol", "update", "nodename=%s" % compress_hostlist(to_resume), "state=resume"])
    deadline = time.time() + 10
    while True:
        now = slurm.nodes(to_resume)
        pending = [n for n in to_resume if now.get(n, {}).get("drained", True)]
        if not pending or time.time() > deadline:
            break
        time.sleep(0.2)
    if pending:
        module.fail_json(msg="spares did not resume: %s" % ", ".join(pending), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
