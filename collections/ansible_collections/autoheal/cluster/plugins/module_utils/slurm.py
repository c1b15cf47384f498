# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Shared helpers for the autoheal.cluster Slurm modules.

Everything here runs Slurm commands through ``AnsibleModule.run_command`` with a list argv (never a
shell) and parses their JSON output in a way that tolerates both Slurm 22.05 (data parser
openapi/v0.0.38) and newer releases (v0.0.39+ / 23.x / 24.x). The differences that matter:

- ``sinfo --json``: 22.05 returns ``{"nodes": [...]}`` with ``state`` a lower-case string
  (``"idle"``) and ``state_flags`` a list (``["DRAIN"]``). 23.x returns ``state`` as a list
  (``["IDLE", "DRAIN"]``) and no ``state_flags``. 24.x ``sinfo --json`` returns ``{"sinfo": [...]}``
  groups whose ``node.state`` is a list, names under ``nodes.nodes`` and reason under
  ``reason.description``.
- ``squeue --json``: 22.05 has ``job_state`` as a string (``"RUNNING"``) and plain integers;
  newer releases have ``job_state`` as a list (``["RUNNING"]``) and wrap many integers as
  ``{"set": true, "infinite": false, "number": N}``. The node list is ``nodes`` (a hostlist string)
  in both; 22.05 also has ``job_resources.allocated_nodes[].nodename`` where 24.x has
  ``job_resources.nodes.allocation[].name``.
- 22.05 ``sinfo --json`` and ``squeue --json`` ignore ``-n`` / ``-w`` filters: filter here.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re

NODE_NAME_RE = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
MAX_NODE_NAME = 253
# A reason/comment reaches scontrol as one argv element; still keep it to printable, single-line
# text so it can never be mistaken for another scontrol keyword or break `scontrol show -o`.
TEXT_RE = re.compile(r"^[A-Za-z0-9 _.,:;/+()#@%=\-\[\]]{1,240}$")
DEFAULT_PREFIX = "autoheal: "

SLURM_COMMON_ARGS = dict(
    slurm_conf=dict(type="path"),
    bin_dir=dict(type="path"),
    timeout=dict(type="int", default=30),
)


def validate_nodes(module, nodes, field="nodes"):
    """Fail the module unless every entry is a valid node name; return the de-duplicated list."""
    bad = [n for n in nodes if not isinstance(n, str) or not (0 < len(n) <= MAX_NODE_NAME)
           or not NODE_NAME_RE.match(n)]
    if bad:
        module.fail_json(msg="%s: invalid node name(s): %s" % (field, ", ".join(repr(b)[:80] for b in bad[:10])))
    seen = []
    for n in nodes:
        if n not in seen:
            seen.append(n)
    return seen


def validate_text(module, value, field):
    if value is None:
        return None
    if not TEXT_RE.match(value):
        module.fail_json(msg="%s: %r has characters outside [A-Za-z0-9 _.,:;/+()#@%%=-[]] or is too long"
                         % (field, value[:80]))
    return value


# --- hostlists ---------------------------------------------------------------------------------

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text):
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p for p in parts if p]


def _expand_one(expr):
    m = re.search(r"\[([^\]]*)\]", expr)
    if not m:
        return [expr]
    head, body, tail = expr[: m.start()], m.group(1), expr[m.end():]
    out = []
    for item in body.split(","):
        r = _RANGE_RE.match(item.strip())
        if not r:
            raise ValueError("bad hostlist range %r in %r" % (item, expr))
        lo, hi = r.group(1), r.group(2) or r.group(1)
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        for i in range(int(lo), int(hi) + 1):
            num = str(i).zfill(width) if width else str(i)
            out.extend(_expand_one(head + num + tail))
    return out


def expand_hostlist(text):
    """Expand a Slurm hostlist such as ``gpu-[1-3,7],cpu-01`` into node names (order kept)."""
    if not text:
        return []
    out = []
    for part in _split_top(text.strip()):
        for name in _expand_one(part):
            if name not in out:
                out.append(name)
    return out


def compress_hostlist(names):
    """Compress node names into a Slurm hostlist (``gpu-1,gpu-2,gpu-3`` -> ``gpu-[1-3]``).

    Only a trailing number is ranged; names keep their order of first appearance per prefix.
    Zero-padded numbers are ranged only with numbers of the same width.
    """
    groups = []  # (prefix, width) -> list of ints, kept in order
    index = {}
    plain = []
    for name in names:
        m = re.match(r"^(.*?)(\d+)$", name)
        if not m:
            plain.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in index:
            index[key] = len(groups)
            groups.append((prefix, width, []))
        nums = groups[index[key]][2]
        if int(digits) not in nums:
            nums.append(int(digits))
    parts = list(plain)
    for prefix, width, nums in groups:
        nums = sorted(nums)
        ranges, start, prev = [], nums[0], nums[0]
        for n in nums[1:]:
            if n == prev + 1:
                prev = n
                continue
            ranges.append((start, prev))
            start = prev = n
        ranges.append((start, prev))

        def fmt(n):
            return str(n).zfill(width) if width else str(n)

        if len(nums) == 1:
            parts.append(prefix + fmt(nums[0]))
            continue
        body = ",".join(fmt(a) if a == b else "%s-%s" % (fmt(a), fmt(b)) for a, b in ranges)
        parts.append("%s[%s]" % (prefix, body))
    return ",".join(parts)


# --- running Slurm -----------------------------------------------------------------------------


class SlurmError(Exception):
    """A Slurm command failed (raised instead of fail_json when Slurm.raise_errors is set)."""


class Slurm(object):
    """Runs Slurm client commands for a module, with SLURM_CONF set when given."""

    def __init__(self, module):
        self.module = module
        self.bin_dir = module.params.get("bin_dir")
        self.timeout = module.params.get("timeout") or 30
        self.env = {}
        conf = module.params.get("slurm_conf")
        if conf:
            if not os.path.isfile(conf):
                module.fail_json(msg="slurm_conf %s does not exist" % conf)
            self.env["SLURM_CONF"] = conf
        self.commands = []
        # in a worker thread fail_json would print a result and end only that thread: raise
        self.raise_errors = False

    def require(self, *names):
        """Resolve the commands now (fail_json from the main thread if one is missing)."""
        for name in names:
            self._bin(name)

    def _bin(self, name):
        if self.bin_dir:
            return os.path.join(self.bin_dir, name)
        path = self.module.get_bin_path(name, required=True)
        return path

    def run(self, argv, check_rc=True):
        argv = [self._bin(argv[0])] + list(argv[1:])
        self.commands.append(argv)
        rc, out, err = self.module.run_command(
            argv, environ_update=self.env, check_rc=False, expand_user_and_vars=False
        )
        if check_rc and rc != 0 and self.raise_errors:
            raise SlurmError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out).strip()))
        if check_rc and rc != 0:
            self.module.fail_json(
                msg="%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out).strip()),
                rc=rc, stdout=out, stderr=err, commands=self.commands,
            )
        return rc, out, err

    def json(self, argv):
        rc, out, err = self.run(argv)
        try:
            return json.loads(out)
        except ValueError as exc:
            if self.raise_errors:
                raise SlurmError("%s: output is not JSON (%s)" % (" ".join(argv), exc))
            self.module.fail_json(msg="%s: output is not JSON (%s)" % (" ".join(argv), exc),
                                  stdout=out[:2000], stderr=err)

    def nodes(self, names=None):
        """Nodes as {name: {state, flags, reason, comment, features, partitions}}: every node, or
        only `names` (and no others). For named nodes, sinfo's text output filtered to them: the
        JSON of a 2,000-node cluster costs ~0.2 s more per read, and a play reads the nodes it
        changes several times. A name the text output lacks (a FUTURE node) is looked up in the
        full JSON, so both paths know the same nodes."""
        if names is None:
            return parse_sinfo(self.json(["sinfo", "--json"]))
        names = list(names)
        if not names:
            return {}
        rc, out, err = self.run(["sinfo", "-N", "-h", "-n", compress_hostlist(names), "-O", SINFO_TEXT_FORMAT])
        found = parse_sinfo_text(out)
        if any(n not in found for n in names):
            found = self.nodes()
        return dict((n, found[n]) for n in names if n in found)

    def jobs(self):
        return parse_squeue(self.json(["squeue", "--json"]))


# --- parsing -----------------------------------------------------------------------------------

BASE_STATES = ("IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "PLANNED")


def _num(value):
    """Plain int in 22.05; {"set": bool, "infinite": bool, "number": N} in newer Slurm."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return None
        if value.get("set", True):
            return value.get("number")
        return None
    return value


def _text(value):
    if isinstance(value, dict):  # 24.x: {"description": ..., "time": ..., "user": ...}
        return value.get("description") or ""
    return value or ""


def _split_state(state, flags):
    """Return (base, flags) from 22.05 (str + flags list) or newer (list) state fields."""
    if isinstance(state, list):
        words = [str(s).upper() for s in state]
    else:
        words = [w for w in re.split(r"[+ ]", str(state or "").upper()) if w]
    words += [str(f).upper() for f in (flags or [])]
    base = "UNKNOWN"
    rest = []
    for w in words:
        w = w.rstrip("*~#!%$@^-")
        if w in BASE_STATES and base == "UNKNOWN":
            base = w
        elif w and w not in rest and w not in BASE_STATES:
            rest.append(w)
    # "DRAINED"/"DRAINING" are derived names some formats use; normalise to the DRAIN flag
    if "DRAINED" in rest or "DRAINING" in rest:
        rest = [f for f in rest if f not in ("DRAINED", "DRAINING")]
        if "DRAIN" not in rest:
            rest.append("DRAIN")
    return base, sorted(rest)


def _node_record(name, state, flags, reason, comment, features, partitions):
    base, flags = _split_state(state, flags)
    return dict(
        name=name,
        state=base.lower(),
        flags=flags,
        reason=reason or "",
        comment=comment or "",
        features=features if isinstance(features, list) else [f for f in (features or "").split(",") if f],
        partitions=list(partitions or []),
        drained="DRAIN" in flags,
        down=base == "DOWN",
        responding="NOT_RESPONDING" not in flags,
    )


SINFO_SEP = "\x1f"  # unit separator: never in a node name, a state, a partition or our texts
SINFO_TEXT_FIELDS = ("NodeList", "StateComplete", "Partition", "Features", "Comment", "Reason")
# ":0" is the full width (no padding, no truncation); the separator is each field's suffix; the
# reason comes last, so a separator inside an administrator's reason cannot shift the others
SINFO_TEXT_FORMAT = ",".join("%s:0%s" % (f, SINFO_SEP) for f in SINFO_TEXT_FIELDS[:-1]) + ",Reason:0"


def parse_sinfo_text(out):
    """`sinfo -N -h -O SINFO_TEXT_FORMAT` (one line per node and partition) -> node records.
    StateComplete is "idle+drain+not_responding"; an empty comment prints "(null)", an empty
    reason "none"."""
    nodes = {}
    for line in out.splitlines():
        parts = line.split(SINFO_SEP, len(SINFO_TEXT_FIELDS) - 1)
        if len(parts) != len(SINFO_TEXT_FIELDS):
            continue
        name, state, part, feats, comment, reason = [x.strip() for x in parts]
        part = part.rstrip("*")
        if name in nodes:
            if part and part not in nodes[name]["partitions"]:
                nodes[name]["partitions"].append(part)
            continue
        nodes[name] = _node_record(
            name, state, None, "" if reason == "none" else reason, "" if comment == "(null)" else comment,
            "" if feats == "(null)" else feats, [part] if part else [],
        )
    return nodes


def parse_sinfo(data):
    nodes = {}
    if isinstance(data.get("nodes"), list):  # 22.05 and 23.x (and scontrol show nodes --json)
        for n in data["nodes"]:
            name = n.get("name") or n.get("hostname")
            nodes[name] = _node_record(
                name, n.get("state"), n.get("state_flags"), _text(n.get("reason")),
                n.get("comment"), n.get("active_features", n.get("features")), n.get("partitions"),
            )
    elif isinstance(data.get("sinfo"), list):  # 24.x sinfo --json: grouped records
        for group in data["sinfo"]:
            names = (group.get("nodes") or {}).get("nodes") or []
            node = group.get("node") or {}
            feats = (group.get("features") or {}).get("active") or ""
            part = (group.get("partition") or {}).get("name")
            for name in names:
                rec = nodes.get(name)
                if rec is None:
                    rec = _node_record(name, node.get("state"), None, _text(group.get("reason")),
                                       group.get("comment"), feats, [])
                    nodes[name] = rec
                if part and part not in rec["partitions"]:
                    rec["partitions"].append(part)
    return nodes


def _job_nodes(job):
    text = job.get("nodes")
    if isinstance(text, str) and text:
        return expand_hostlist(text)
    res = job.get("job_resources") or {}
    names = [a.get("nodename") for a in res.get("allocated_nodes") or [] if isinstance(a, dict)]
    rn = res.get("nodes")
    if isinstance(rn, dict):
        names += [a.get("name") for a in rn.get("allocation") or []]
        if not names and rn.get("list"):
            return expand_hostlist(rn["list"])
    elif isinstance(rn, str) and rn:
        return expand_hostlist(rn)
    return [n for n in names if n]


def parse_squeue(data):
    jobs = []
    for j in data.get("jobs") or []:
        state = j.get("job_state")
        if isinstance(state, list):
            states = [str(s).upper() for s in state]
        else:
            states = [str(state or "").upper()]
        jobs.append(dict(
            job_id=_num(j.get("job_id")),
            name=j.get("name") or "",
            user=j.get("user_name") or "",
            state=states[0] if states else "",
            state_flags=states[1:],
            nodes=_job_nodes(j),
            requeue=bool(j.get("requeue")),
            batch=bool(j.get("batch_flag", True)),
            restart_count=_num(j.get("restart_cnt")) or 0,
            end_time=_num(j.get("end_time")),
            start_time=_num(j.get("start_time")),
            exit_code=_exit_code(j.get("exit_code")),
        ))
    return jobs


def _exit_code(value):
    if isinstance(value, dict):  # newer: {"status": [...], "return_code": {...}, "signal": {...}}
        return _num(value.get("return_code"))
    return value
