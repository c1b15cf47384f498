# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Finding and signalling the Slurm jobs on a batch of nodes, shared by autoheal.cluster.fence
(SIGTERM in the same step as the drain, so jobs start their checkpoint at the fence) and
autoheal.cluster.slurm_jobs (which then only waits for each job to leave and requeues it)."""

from __future__ import annotations

import fcntl
import json
import os
import time
from typing import Any

from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import Slurm

ACTIVE = ("RUNNING", "CONFIGURING", "SUSPENDED", "RESIZING", "SIGNALING", "STAGE_OUT")


def job_record(j: dict[str, Any]) -> dict[str, Any]:
    """What the modules report of one job (and what slurm_jobs takes back from the fence)."""
    return dict(
        job_id=j["job_id"],
        name=j["name"],
        user=j["user"],
        nodes=j["nodes"],
        state_before=j["state"],
        state_after=j["state"],
        requeueable=bool(j["requeue"] and j["batch"]),
        batch=j["batch"],
        restart_count=j["restart_count"],
        signalled=False,
        ended_in_grace=False,
        requeued=False,
    )


def find_jobs(slurm: Slurm, nodes: set[str]) -> list[dict[str, Any]]:
    """A record per active job on any of `nodes` (a multi-node job once), by job id."""
    found = sorted(
        (j for j in slurm.jobs() if j["state"] in ACTIVE and nodes.intersection(j["nodes"])),
        key=lambda j: j["job_id"],
    )
    return [job_record(j) for j in found]


def jobs_with_steps(slurm: Slurm, ids: list[int]) -> set[int]:
    """Job ids among `ids` that run at least one job step besides the batch script and extern."""
    rc, out, _err = slurm.run(
        ["squeue", "--noheader", "--steps", "--format=%i", "--jobs=" + ",".join(str(i) for i in ids)],
        check_rc=False,
    )
    found = set()
    for line in (out or "").split() if rc == 0 else []:
        job, _dot, step = line.partition(".")
        if step.isdigit() and job.isdigit():
            found.add(int(job))
    return found


def signal(slurm: Slurm, ids: list[int], sig: str, result: dict[str, Any]) -> None:
    """Signal the jobs, one scancel call per group for the whole batch.

    Who gets the signal: the tasks of a job's steps (the training processes srun started), or,
    for a job that runs no step, its batch shell. Never both with --full: that signals srun
    itself, which answers SIGTERM by killing its tasks at once ("forcing job termination"), so
    they never get to checkpoint. A job that ended meanwhile makes scancel complain, which is not
    fatal."""
    with_steps = jobs_with_steps(slurm, ids)
    groups = [
        ([i for i in ids if i in with_steps], []),
        ([i for i in ids if i not in with_steps], ["--batch"]),
    ]
    result["signalled_at"] = time.time()
    errors = []
    for group, flags in groups:
        if group:
            rc, out, err = slurm.run(["scancel", f"--signal={sig}", *flags, *map(str, group)], check_rc=False)
            if rc != 0:
                errors.append((err or out).strip())
    if errors:
        result["signal_stderr"] = "; ".join(errors)


class SignalLedger:
    """Which jobs a run has signalled and requeued, and when: a JSON file beside the run's
    journal events, read and written under an exclusive lock (flock).

    Why: the warm fence and the play's own steps are two processes acting on the same run, the
    first ~2-3 s ahead. Whichever comes first signals a job, or requeues it the moment it has
    left; the other finds that here and does not do it again (a second SIGTERM can abort a
    checkpoint under way; a second requeue fails, or would requeue the job's next run) nor loses
    it (a job that checkpointed in 0.2 s has left before the play looks, and still needs its
    requeue). Use as a context manager: the lock is held until it exits.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.jobs: dict[int, float] = {}  # job id -> when it was signalled
        self.requeued: dict[int, float] = {}  # job id -> when it was requeued
        # job id -> its nodes when signalled: a job that has left shows none in squeue, and the
        # journal still says which node's jobs were requeued (and the runner tells their owners)
        self.nodes: dict[int, list[str]] = {}
        self._fd: int | None = None

    def __enter__(self) -> SignalLedger:
        if self.path:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            raw = os.pread(self._fd, 1 << 20, 0)
            try:
                data = json.loads(raw) if raw.strip() else {}
            except ValueError:
                data = {}  # torn by a crash mid-write: signal again rather than lose a requeue
            self.jobs = {int(k): float(v) for k, v in (data.get("signalled") or {}).items()}
            self.requeued = {int(k): float(v) for k, v in (data.get("requeued") or {}).items()}
            self.nodes = {int(k): [str(n) for n in v] for k, v in (data.get("nodes") or {}).items()}
        return self

    def add(self, ids: list[int], at: float, nodes: dict[int, list[str]] | None = None) -> None:
        """Record jobs signalled at `at` (and, given, the nodes each ran on)."""
        for i in ids:
            self.jobs.setdefault(i, at)
            if nodes and nodes.get(i):
                self.nodes.setdefault(i, list(nodes[i]))
        self._save()

    def add_requeued(self, ids: list[int], at: float) -> None:
        for i in ids:
            self.requeued.setdefault(i, at)
        self._save()

    def _save(self) -> None:
        if self._fd is None:
            return
        data = {
            "signalled": {str(k): v for k, v in sorted(self.jobs.items())},
            "requeued": {str(k): v for k, v in sorted(self.requeued.items())},
            "nodes": {str(k): v for k, v in sorted(self.nodes.items())},
        }
        raw = json.dumps(data).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, raw, 0)
        os.fsync(self._fd)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None
