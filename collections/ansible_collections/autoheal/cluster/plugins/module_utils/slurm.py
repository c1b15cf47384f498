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
- 24.x ``squeue --json`` lists only the default states (no COMPLETED, FAILED...); 22.05 lists every
  job. ``--states=all`` makes both list a job that has just ended (seen on the pods lab).
- 24.x ``sinfo --json`` groups nodes of the same state and reports ONE reason per group: two
  drained nodes (a hot spare and a node autoheal just fenced) come back with the same reason, so
  the spare looks taken and a fence's reason looks like an admin's. Where it groups, the nodes
  are read from ``scontrol show nodes --json`` instead (one record, one reason per node; 22.05 has
  no such command, and no grouping). Measured on the pods lab, Slurm 24.11.5.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterable

from ansible_collections.autoheal.cluster.plugins.module_utils.backoff import Backoff
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import REASON_PREFIX
from ansible_collections.autoheal.cluster.plugins.module_utils.hostlist import (
    compress_hostlist,
    expand_hostlist,
)

# The prefix every reason autoheal sets starts with ("autoheal: XID 79 gpu3 inc-..."); a held node
# whose reason lacks it belongs to someone else.
DEFAULT_PREFIX = REASON_PREFIX + " "

SLURM_COMMON_ARGS: dict[str, dict[str, Any]] = dict(
    slurm_conf=dict(type="path"),
    bin_dir=dict(type="path"),
    timeout=dict(type="int", default=30),
    controller_wait=dict(type="int", default=60),
)
# What a Slurm client prints when it could not reach slurmctld at all (its connect failed, after
# the client's own retries): the command did nothing, so running it again is safe. A timeout
# after the request was sent is NOT retried: the controller may have applied it.
UNREACHABLE = "Unable to contact slurm controller"
RETRY_FIRST_S, RETRY_CAP_S = 0.5, 4.0

Node = Dict[str, Any]  # a normalised node record (see _node_record)
Job = Dict[str, Any]  # a normalised job record (see parse_squeue)


# --- running Slurm -----------------------------------------------------------------------------


class SlurmError(Exception):
    """A Slurm command failed (raised instead of fail_json when Slurm.raise_errors is set)."""


class _Unreachable(Exception):
    """A command's client could not reach slurmctld: it did nothing, so it is tried again."""

    def __init__(self, rc: int, out: str, err: str) -> None:
        Exception.__init__(self, err or out)
        self.result = (rc, out, err)


class Slurm:
    """Runs Slurm client commands for a module, with SLURM_CONF set when given."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.bin_dir: str | None = module.params.get("bin_dir")
        self.timeout = int(module.params.get("timeout") or 30)
        # slurmctld restarting or failing over: how long to keep trying before failing the step
        self.controller_wait = max(0, int(module.params.get("controller_wait") or 0))
        self.controller_retries = 0  # commands run again because slurmctld could not be reached
        # 0.5 s doubling to 4 s, no jitter (as before the shared backoff); call() counts per command
        self.retry = Backoff(RETRY_FIRST_S, RETRY_CAP_S, jitter=0.0, within=self.controller_wait)
        # a hung slurmctld must not hang the play: every command runs under coreutils' timeout
        self.timeout_bin: str | None = module.get_bin_path("timeout")
        self.env: dict[str, str] = {}
        self._grouped = False  # sinfo --json groups nodes (24.x): read them with scontrol instead
        conf = module.params.get("slurm_conf")
        if conf:
            if not os.path.isabs(conf):
                # the module's working directory is not the engineer's: a relative path would be
                # read from the wrong place (the plays make their paths absolute before this)
                module.fail_json(msg=f"slurm_conf {conf}: give an absolute path")
            if not os.path.isfile(conf):
                module.fail_json(msg=f"slurm_conf {conf} does not exist")
            self.env["SLURM_CONF"] = conf
        self.commands: list[list[str]] = []
        # in a worker thread fail_json would print a result and end only that thread: raise
        self.raise_errors = False

    def require(self, *names: str) -> None:
        """Resolve the commands now (fail_json from the main thread if one is missing)."""
        for name in names:
            self._bin(name)

    def _bin(self, name: str) -> str:
        if self.bin_dir:
            return os.path.join(self.bin_dir, name)
        return str(self.module.get_bin_path(name, required=True))

    def fail(self, msg: str, **extra: Any) -> None:
        """Stop: raise in a worker thread, fail the module otherwise."""
        if self.raise_errors:
            raise SlurmError(msg)
        self.module.fail_json(msg=msg, commands=self.commands, **extra)

    def run(self, argv: list[str], check_rc: bool = True) -> tuple[int, str, str]:
        argv = [self._bin(argv[0]), *argv[1:]]
        self.commands.append(argv)
        limit = [self.timeout_bin, "--kill-after=5", str(self.timeout)] if self.timeout_bin else []

        def once() -> tuple[int, str, str]:
            rc, out, err = self.module.run_command(
                limit + argv, environ_update=self.env, check_rc=False, expand_user_and_vars=False
            )
            if rc != 0 and UNREACHABLE in f"{err}{out}":
                raise _Unreachable(rc, out, err)
            return rc, out, err

        def counted(_exc: BaseException, _pause: float) -> None:
            self.controller_retries += 1

        # slurmctld down (restarting, failing over): wait and try again, with a growing pause,
        # until controller_wait has passed; then the step fails as before
        try:
            rc, out, err = self.retry.call(once, (_Unreachable,), on_retry=counted)
        except _Unreachable as exc:
            rc, out, err = exc.result
        if rc != 0 and UNREACHABLE in f"{err}{out}":
            err = (
                f"{err.strip()} (tried {self.controller_retries + 1} time(s) over controller_wait"
                f"={self.controller_wait}s; raise controller_wait to ride out a longer slurmctld restart)"
            )
        if rc == 124 and limit:
            err = f"timed out after {self.timeout}s (option timeout)"
        if check_rc and rc != 0:
            self.fail(
                f"{' '.join(argv)} failed (rc={rc}): {(err or out).strip()}", rc=rc, stdout=out, stderr=err
            )
        return int(rc), str(out), str(err)

    def json(self, argv: list[str]) -> dict[str, Any]:
        _rc, out, err = self.run(argv)
        try:
            data: dict[str, Any] = json.loads(out)
        except ValueError as exc:
            self.fail(f"{' '.join(argv)}: output is not JSON ({exc})", stdout=out[:2000], stderr=err)
            raise  # not reached: fail() does not return
        if not isinstance(data, dict):
            self.fail(f"{' '.join(argv)}: output is not a JSON object")
        return data

    def nodes(self, names: Iterable[str] | None = None) -> dict[str, Node]:
        """Nodes as {name: record}: every node, or only `names` (and no others). For named nodes,
        sinfo's text output filtered to them: the JSON of a 2,000-node cluster costs ~0.2 s more
        per read, and a play reads the nodes it changes several times. A name the text output
        lacks (a FUTURE node) is looked up in the full JSON, so both paths know the same nodes."""
        if names is None:
            if self._grouped:
                return parse_sinfo(self.json(["scontrol", "show", "nodes", "--json"]))
            data = self.json(["sinfo", "--json"])
            if isinstance(data.get("sinfo"), list):  # 24.x: one reason per group (see the top)
                self._grouped = True
                return self.nodes()
            return parse_sinfo(data)
        wanted = list(names)
        if not wanted:
            return {}
        _rc, out, _err = self.run(
            ["sinfo", "-N", "-h", "-n", compress_hostlist(wanted), "-O", SINFO_TEXT_FORMAT]
        )
        found = parse_sinfo_text(out)
        if any(n not in found for n in wanted):
            found = self.nodes()
        return {n: found[n] for n in wanted if n in found}

    def jobs(self) -> list[Job]:
        # every state: 24.x squeue --json drops a job that ended (as squeue does by default), so a
        # job that left at its SIGTERM before the evacuation listed it was never requeued ("no
        # jobs"); 22.05 lists every job anyway. The callers pick the states they act on.
        return parse_squeue(self.json(["squeue", "--json", "--states=all"]))


# --- parsing -----------------------------------------------------------------------------------

BASE_STATES = ("IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "PLANNED")


def _num(value: Any) -> Any:
    """Plain int in 22.05; {"set": bool, "infinite": bool, "number": N} in newer Slurm."""
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        return value.get("number")
    return value


def _text(value: Any) -> str:
    if isinstance(value, dict):  # 24.x: {"description": ..., "time": ..., "user": ...}
        return str(value.get("description") or "")
    return str(value or "")


def _split_state(state: Any, flags: Iterable[Any] | None) -> tuple[str, list[str]]:
    """Return (base, flags) from 22.05 (str + flags list) or newer (list) state fields."""
    if isinstance(state, list):
        words = [str(s).upper() for s in state]
    else:
        words = [w for w in re.split(r"[+ ]", str(state or "").upper()) if w]
    words += [str(f).upper() for f in (flags or [])]
    base = "UNKNOWN"
    rest: list[str] = []
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


def _features(value: Any) -> list[str]:
    return list(value) if isinstance(value, list) else [f for f in str(value or "").split(",") if f]


def _node_record(
    name: str, state: Any, flags: Any, reason: str, comment: Any, features: Any, partitions: Any
) -> Node:
    base, flag_list = _split_state(state, flags)
    return dict(
        name=name,
        state=base.lower(),
        flags=flag_list,
        reason=reason or "",
        comment=comment or "",
        features=_features(features),
        partitions=list(partitions or []),
        drained="DRAIN" in flag_list,
        down=base == "DOWN",
        responding="NOT_RESPONDING" not in flag_list,
    )


SINFO_SEP = "\x1f"  # unit separator: never in a node name, a state, a partition or our texts
SINFO_TEXT_FIELDS = ("NodeList", "StateComplete", "Partition", "Features", "Comment", "Reason")
# ":0" is the full width (no padding, no truncation); the separator is each field's suffix; the
# reason comes last, so a separator inside an administrator's reason cannot shift the others
SINFO_TEXT_FORMAT = ",".join(f"{f}:0{SINFO_SEP}" for f in SINFO_TEXT_FIELDS[:-1]) + ",Reason:0"


def parse_sinfo_text(out: str) -> dict[str, Node]:
    """`sinfo -N -h -O SINFO_TEXT_FORMAT` (one line per node and partition) -> node records.
    StateComplete is "idle+drain+not_responding"; an empty comment prints "(null)", an empty
    reason "none"."""
    nodes: dict[str, Node] = {}
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(SINFO_SEP, len(SINFO_TEXT_FIELDS) - 1)]
        if len(parts) != len(SINFO_TEXT_FIELDS):
            continue
        name, state, part, feats, comment, reason = parts
        part = part.rstrip("*")
        if name not in nodes:
            nodes[name] = _node_record(
                name,
                state,
                None,
                "" if reason == "none" else reason,
                "" if comment == "(null)" else comment,
                "" if feats == "(null)" else feats,
                [],
            )
        if part and part not in nodes[name]["partitions"]:
            nodes[name]["partitions"].append(part)
    return nodes


def _parse_sinfo_groups(groups: list[dict[str, Any]]) -> dict[str, Node]:
    """24.x `sinfo --json`: grouped records, node names under nodes.nodes."""
    nodes: dict[str, Node] = {}
    for group in groups:
        node = group.get("node") or {}
        feats = (group.get("features") or {}).get("active") or ""
        part = (group.get("partition") or {}).get("name")
        for name in (group.get("nodes") or {}).get("nodes") or []:
            rec = nodes.get(name)
            if rec is None:
                rec = nodes[name] = _node_record(
                    name, node.get("state"), None, _text(group.get("reason")), group.get("comment"), feats, []
                )
            if part and part not in rec["partitions"]:
                rec["partitions"].append(part)
    return nodes


def parse_sinfo(data: dict[str, Any]) -> dict[str, Node]:
    if isinstance(data.get("sinfo"), list):
        return _parse_sinfo_groups(data["sinfo"])
    nodes: dict[str, Node] = {}
    for n in data.get("nodes") or []:  # 22.05 and 23.x (and scontrol show nodes --json)
        name = n.get("name") or n.get("hostname")
        nodes[name] = _node_record(
            name,
            n.get("state"),
            n.get("state_flags"),
            _text(n.get("reason")),
            n.get("comment"),
            n.get("active_features", n.get("features")),
            n.get("partitions"),
        )
    return nodes


def _job_nodes(job: dict[str, Any]) -> list[str]:
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
    return [str(n) for n in names if n]


def _states(value: Any) -> list[str]:
    return [str(s).upper() for s in value] if isinstance(value, list) else [str(value or "").upper()]


def _exit_code(value: Any) -> Any:
    if isinstance(value, dict):  # newer: {"status": [...], "return_code": {...}, "signal": {...}}
        return _num(value.get("return_code"))
    return value


def parse_squeue(data: dict[str, Any]) -> list[Job]:
    jobs: list[Job] = []
    for j in data.get("jobs") or []:
        states = _states(j.get("job_state"))
        jobs.append(
            dict(
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
            )
        )
    return jobs
