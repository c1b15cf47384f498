#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: slurm_jobs
short_description: List, signal and requeue the Slurm jobs running on a batch of nodes
description:
  - Finds the jobs running on any of O(nodes) (a multi-node job is handled once, on all its nodes).
  - With O(action=evacuate) it sends O(signal) (SIGTERM) to every process of those jobs in one
    C(scancel --signal=TERM) call (job steps; the batch shell of jobs that run no step), waits up
    to O(grace_seconds) for them to end (a job that
    traps SIGTERM writes its checkpoint and exits), then requeues the batch jobs that allow it with
    one C(scontrol requeue) call. Jobs that do not allow requeue (C(--no-requeue), or interactive
    jobs) are signalled and reported in RV(not_requeued); they are never requeued.
  - Jobs still running when the grace period ends are requeued too (Slurm then sends SIGTERM and,
    after C(KillWait), SIGKILL) when O(requeue_after_grace) is true.
  - A job Slurm has already requeued by itself (it is C(PENDING) again) counts as requeued.
  - >-
    Jobs that M(autoheal.cluster.fence) already signalled (O(signalled_job_ids), at O(signalled_at))
    are not signalled again; they are waited for (the grace period counts from their signal) and
    requeued the moment each has left, even when it left before this module started.
  - >-
    How it sees a job leave - C(squeue -h -j IDS -o "%i %T"), first after O(poll_interval) (0.1 s),
    the pause growing to O(poll_interval_max) (0.5 s), a few milliseconds of slurmctld time each.
    Slurm 22.05 pushes no job-end event to a client (a C(strigger --fini) fires on slurmctld's
    periodic trigger pass, seconds late), so a short, cheap poll is the fastest way to requeue the
    instant the job is gone.
  - Idempotent - a second run finds no running jobs on the fenced nodes and changes nothing; on a
    node that stays in service, O(started_before) keeps a rerun off the jobs the first run requeued.
  - >-
    Parses C(squeue --json) from Slurm 22.05 (data parser openapi/v0.0.38) and newer releases.
    Differences handled - C(job_state) is a string (C("RUNNING")) in 22.05 and a list
    (C(["RUNNING"])) from 23.02 on; numeric fields such as C(end_time) are plain integers in 22.05
    and C({"set": true, "infinite": false, "number": N}) objects later; the allocated nodes are the
    hostlist string C(nodes) in every release, with C(job_resources.allocated_nodes[].nodename) in
    22.05 and C(job_resources.nodes.allocation[].name) in 24.x as fall-backs; 22.05 ignores C(-w)
    with C(--json), so the module filters by node itself.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
options:
  action:
    description:
      - C(list) only reads; C(signal) signals and returns at once; C(evacuate) signals, waits for the
        grace period and requeues.
    type: str
    default: evacuate
    choices: [list, signal, evacuate]
  signal:
    description: Signal to send.
    type: str
    default: TERM
    choices: [TERM, INT, USR1, USR2, CONT]
  grace_seconds:
    description: How long to wait after the signal for the jobs to end (checkpoint) before requeueing.
    type: int
    default: 120
  poll_interval:
    description:
      - Seconds between the first C(squeue) polls while waiting; each pause then grows by a third,
        up to O(poll_interval_max). A job that checkpoints at once is seen leaving within 0.1 s; a
        storm's many runs waiting out long checkpoints do not spawn ten C(squeue) a second each.
    type: float
    default: 0.1
  poll_interval_max:
    description: The longest pause between C(squeue) polls while waiting.
    type: float
    default: 0.5
    version_added: 0.3.0
  signalled_job_ids:
    description: Jobs already signalled (by M(autoheal.cluster.fence)); not signalled again.
    type: list
    elements: int
    default: []
  signalled_at:
    description: Epoch time of that signal (the grace period counts from it); default now.
    type: float
  requeue:
    description: Requeue the jobs that allow it. When false, jobs are only signalled and waited for.
    type: bool
    default: true
  requeue_after_grace:
    description: Requeue jobs still running when the grace period ends (Slurm kills them after KillWait).
    type: bool
    default: true
  started_before:
    description:
      - Epoch time of the fault; only jobs that started at or before it are acted on (the jobs that
        were on the GPU when it failed). A job requeued by an earlier run has started again since,
        so a rerun leaves it alone - the idempotence of a rung that keeps the node in service
        (restart_app), where the job may start again on the same node. Omitted, every job counts.
    type: float
    version_added: 0.3.0
  signal_ledger:
    description:
      - A file recording which jobs this run signalled and requeued (see M(autoheal.cluster.fence)'s
        O(autoheal.cluster.fence#module:signal_ledger)). A job recorded there as requeued is not
        waited for nor requeued again (another process of the run - the runner's warm path -
        requeued it the moment it left); it is reported requeued, at the recorded time. Jobs
        this module requeues are recorded there, under the file's lock.
    type: path
    version_added: 0.3.0
notes:
  - Check mode lists the jobs and reports what would be signalled and requeued; it sends nothing.
  - A job that finishes on its own between the listing and the signal is still requeued if it
    allows requeue (Slurm cannot tell the two apart); batch scripts should make a restart after
    completion harmless (a checkpoint that says "done").
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.no_diff
  - autoheal.cluster.nodes
  - autoheal.cluster.slurm
"""

EXAMPLES = r"""
- name: Give the jobs on the failed nodes two minutes to checkpoint, then requeue them
  autoheal.cluster.slurm_jobs:
    nodes: [gpu-3]
    action: evacuate
    grace_seconds: 120
    slurm_conf: /etc/slurm/slurm.conf
  register: evac

- name: Only list the jobs
  autoheal.cluster.slurm_jobs:
    nodes: "{{ autoheal_nodes }}"
    action: list
"""

RETURN = r"""
jobs:
  description: The jobs found on the nodes, with what happened to each.
  returned: always
  type: list
  elements: dict
  sample:
    - job_id: 12
      name: train
      nodes: [gpu-3, gpu-4]
      state_before: RUNNING
      state_after: PENDING
      requeueable: true
      signalled: true
      ended_in_grace: true
      requeued: true
job_ids:
  description: Ids of the jobs found running on the nodes.
  returned: always
  type: list
  elements: int
signalled_job_ids:
  description: Jobs signalled (would be, in check mode).
  returned: always
  type: list
  elements: int
requeued_job_ids:
  description: Jobs requeued (would be, in check mode).
  returned: always
  type: list
  elements: int
not_requeued:
  description: Jobs not requeued, with why (no requeue allowed, not a batch job, requeue failed).
  returned: always
  type: list
  elements: dict
still_running_job_ids:
  description: Jobs still running when the grace period ended.
  returned: always
  type: list
  elements: int
waited_seconds:
  description: Seconds spent waiting for the jobs to end.
  returned: always
  type: float
signalled_at:
  description: Epoch time of the signal (null when nothing was signalled).
  returned: always
  type: float
requeued_at:
  description: Epoch time of the requeue (null when nothing was requeued).
  returned: always
  type: float
requeued_elsewhere:
  description: Jobs O(signal_ledger) shows another process of the run had already requeued.
  returned: always
  type: list
  elements: int
commands:
  description: Commands run (argv lists).
  returned: always
  type: list
"""

import time
from typing import Any, Iterable

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import SLURM_COMMON_ARGS, Job, Slurm
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm_signal import (
    ACTIVE,
    SignalLedger,
    job_record,
    signal,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes

ENDING = (*ACTIVE, "COMPLETING")
REQUEUED = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED")


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        action=dict(type="str", default="evacuate", choices=["list", "signal", "evacuate"]),
        signal=dict(type="str", default="TERM", choices=["TERM", "INT", "USR1", "USR2", "CONT"]),
        grace_seconds=dict(type="int", default=120),
        poll_interval=dict(type="float", default=0.1),
        poll_interval_max=dict(type="float", default=0.5),
        signalled_job_ids=dict(type="list", elements="int", default=[]),
        signalled_at=dict(type="float"),
        requeue=dict(type="bool", default=True),
        requeue_after_grace=dict(type="bool", default=True),
        started_before=dict(type="float"),
        signal_ledger=dict(type="path"),
    )
    spec.update(SLURM_COMMON_ARGS)
    return spec


def by_id(jobs: Iterable[Job]) -> dict[int, Job]:
    return {j["job_id"]: j for j in jobs}


def find_jobs(
    slurm: Slurm, nodes: set[str], earlier: set[int], started_before: float | None = None
) -> list[dict[str, Any]]:
    """A record per active job on any of `nodes` (a multi-node job once) that started by
    `started_before` (when given), and per job in `earlier` (signalled at the fence) whatever its
    state now: it may have left already."""

    def victim(j: Job) -> bool:
        if j["state"] not in ACTIVE or not nodes.intersection(j["nodes"]):
            return False
        return started_before is None or (j["start_time"] or 0) <= started_before

    found = sorted(
        (j for j in slurm.jobs() if victim(j) or j["job_id"] in earlier), key=lambda j: j["job_id"]
    )
    return [job_record(j) for j in found]


def with_ledger_nodes(records: list[dict[str, Any]], ledger_path: str | None) -> list[dict[str, Any]]:
    """A job that left before this listing (requeued: pending, no nodes) gets the nodes the run's
    ledger recorded when it was signalled, so the report says which node's jobs these were."""
    if not ledger_path or all(r["nodes"] for r in records):
        return records
    with SignalLedger(ledger_path) as ledger:
        known = dict(ledger.nodes)
    for r in records:
        if not r["nodes"] and known.get(r["job_id"]):
            r["nodes"] = known[r["job_id"]]
    return records


def job_states(slurm: Slurm, ids: list[int]) -> dict[int, str] | None:
    """{id: state} of the jobs Slurm still lists, from squeue's cheapest output; None when squeue
    could not answer (a job it no longer knows is simply absent)."""
    rc, out, err = slurm.run(
        ["squeue", "--noheader", "--jobs=" + ",".join(map(str, ids)), "--format=%i %T"], check_rc=False
    )
    if rc != 0 and "Invalid job id" not in (err or ""):
        return None
    states = {}
    for line in (out or "").splitlines():
        job, _sp, state = line.strip().partition(" ")
        if job.isdigit():
            states[int(job)] = state.strip().upper()
    return states


def wait_for_end(slurm: Slurm, ids: list[int], p: dict[str, Any], result: dict[str, Any]) -> list[int]:
    """Wait for the jobs to end (checkpoint + exit) or the grace period to pass; record each
    job's state; return the ids still running."""
    deadline = result["signalled_at"] + p["grace_seconds"]
    now: dict[int, str] = {}
    pause = p["poll_interval"]
    while True:
        seen = job_states(slurm, ids)
        now = seen if seen is not None else now
        running = [i for i in ids if seen is None or now.get(i) in ENDING]
        if not running or time.time() >= deadline:
            break
        time.sleep(min(pause, max(0.02, deadline - time.time())))
        pause = min(max(p["poll_interval"], p["poll_interval_max"]), pause * 4 / 3)
    result["waited_seconds"] = round(time.time() - result["signalled_at"], 3)
    for r in result["jobs"]:
        r["state_after"] = now.get(r["job_id"], "GONE")
        r["ended_in_grace"] = r["job_id"] not in running
    result["still_running_job_ids"] = running
    return running


def to_requeue(
    records: list[dict[str, Any]], running: list[int], p: dict[str, Any], result: dict[str, Any]
) -> list[int]:
    """The ids to requeue; a job Slurm requeued itself counts as requeued."""
    todo = []
    for r in records:
        if not r["requeueable"]:
            continue
        if r["state_after"] in REQUEUED:
            r["requeued"] = True
        elif r["job_id"] in running and not p["requeue_after_grace"]:
            result["not_requeued"].append(
                dict(job_id=r["job_id"], name=r["name"], reason="still running after the grace period")
            )
        else:
            todo.append(r["job_id"])
    return todo


def requeue(slurm: Slurm, todo: list[int], result: dict[str, Any], ledger_path: str | None) -> dict[int, str]:
    """One scontrol call for the batch; when it fails, one call per job to learn which.
    Returns {job id: error} of those that could not be requeued. Under the run's ledger lock: a
    job another process of the run requeued is only reported (requeued_elsewhere)."""
    failed: dict[int, str] = {}
    with SignalLedger(ledger_path) as ledger:
        elsewhere = {i: ledger.requeued[i] for i in todo if i in ledger.requeued}
        mine = [i for i in todo if i not in elsewhere]
        if mine:
            result["requeued_at"] = time.time()
            rc, _out, _err = slurm.run(["scontrol", "requeue", ",".join(map(str, mine))], check_rc=False)
            for i in mine if rc != 0 else []:
                rc1, out1, err1 = slurm.run(["scontrol", "requeue", str(i)], check_rc=False)
                if rc1 != 0:
                    failed[i] = (err1 or out1).strip()
            ledger.add_requeued([i for i in mine if i not in failed], result["requeued_at"])
    if elsewhere:
        result["requeued_elsewhere"] = sorted(elsewhere)
        result["requeued_at"] = min([*elsewhere.values(), *([result["requeued_at"]] if mine else [])])
    after = by_id(slurm.jobs())
    for r in result["jobs"]:
        if r["job_id"] not in todo:
            continue
        cur = after.get(r["job_id"])
        r["state_after"] = cur["state"] if cur else "GONE"
        if r["job_id"] in failed:
            reason = f"requeue failed: {failed[r['job_id']]}"
            result["not_requeued"].append(dict(job_id=r["job_id"], name=r["name"], reason=reason))
        else:
            r["requeued"] = True
    result["requeued_job_ids"] = [r["job_id"] for r in result["jobs"] if r["requeued"]]
    return failed


def new_result(slurm: Slurm, records: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(
        changed=False,
        jobs=records,
        job_ids=[r["job_id"] for r in records],
        signalled_job_ids=[],
        requeued_job_ids=[],
        not_requeued=[],
        still_running_job_ids=[],
        waited_seconds=0.0,
        signalled_at=None,
        requeued_at=None,
        requeued_elsewhere=[],
        commands=slurm.commands,
    )


def plan_signal(result: dict[str, Any], do_requeue: bool) -> None:
    """Mark every job signalled; report those that do not allow requeue (never requeued)."""
    result.update(changed=True, signalled_job_ids=list(result["job_ids"]))
    for r in result["jobs"]:
        r["signalled"] = True
        if do_requeue and not r["requeueable"]:
            why = "job does not allow requeue" if r["batch"] else "not a batch job"
            result["not_requeued"].append(dict(job_id=r["job_id"], name=r["name"], reason=why))
    if do_requeue:
        result["requeued_job_ids"] = [r["job_id"] for r in result["jobs"] if r["requeueable"]]


def main() -> None:
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    p = module.params
    nodes = set(validate_nodes(module, p["nodes"]))
    if p["grace_seconds"] < 0:
        module.fail_json(msg="grace_seconds must be >= 0")
    slurm = Slurm(module)
    earlier = set(p["signalled_job_ids"])
    found = find_jobs(slurm, nodes, earlier, p["started_before"])
    result = new_result(slurm, with_ledger_nodes(found, p["signal_ledger"]))
    if p["action"] == "list" or not result["jobs"]:
        module.exit_json(**result)
    do_requeue = p["action"] == "evacuate" and p["requeue"]
    plan_signal(result, do_requeue)  # what check mode reports: would signal, would requeue
    if module.check_mode:
        module.exit_json(**result)
    result["requeued_job_ids"] = []
    fresh = [i for i in result["job_ids"] if i not in earlier]
    if fresh:
        signal(slurm, fresh, p["signal"], result)
    if earlier & set(result["job_ids"]):  # the fence's signal: the grace period runs from it
        at = p["signalled_at"] or time.time()
        result["signalled_at"] = min(at, result["signalled_at"] or at)
    if p["action"] == "signal":
        module.exit_json(**result)
    # jobs another process of this run requeued already: not waited for (one may run again by now)
    with SignalLedger(p["signal_ledger"]) as ledger:
        elsewhere = set(ledger.requeued)
    running = wait_for_end(slurm, [i for i in result["job_ids"] if i not in elsewhere], p, result)
    if do_requeue:
        todo = to_requeue(result["jobs"], running, p, result)
        failed = requeue(
            slurm, sorted({*todo, *(elsewhere & set(result["job_ids"]))}), result, p["signal_ledger"]
        )
        if failed:
            module.fail_json(msg=f"requeue failed for jobs {sorted(failed)}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
