"""Slurm's view of the jobs an incident touched, for telling their owners and costing the fault:
who owns each job, its GPUs, whether it runs again (where, since when), and the job's own progress
file when the job names one.

`scontrol show job -o` (one line of Key=Value per job; the same in Slurm 22.05 and later) and
`sinfo -p <pool>` with the runner's slurm.conf. A job names its progress file in
its comment (`sbatch --comment=progress=/abs/path/progress.jsonl`, as the demo does); the runner
reads it only under the configured `owners.progress_roots`, since the comment is the job owner's
text.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

PROGRESS_COMMENT = re.compile(r"(?:^|[ ,;])progress=(/[^\s,;]{1,1000})")
MAX_PROGRESS_BYTES = 8 * 1024 * 1024  # a progress file past this is read from its tail


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    user: str
    state: str  # RUNNING, PENDING, COMPLETED, ...
    nodes: str  # Slurm's hostlist, "" when not running
    gpus: int
    restarts: int
    start_ts: float | None  # when the current run started (None: not started)
    mail_user: str
    comment: str
    partition: str
    reason: str  # why it is pending ("None" when running)

    @property
    def progress_path(self) -> Path | None:
        m = PROGRESS_COMMENT.search(self.comment)
        return Path(m.group(1)) if m else None


def _field(line: str, key: str) -> str:
    m = re.search(rf"(?:^| ){re.escape(key)}=(\S*)", line)
    return m.group(1) if m else ""


def _ts(value: str) -> float | None:
    """Slurm prints local times without a zone (2026-12-03T16:50:00), or Unknown/None."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _gpus(line: str) -> int:
    for key in ("AllocTRES", "TRES", "ReqTRES"):
        m = re.search(r"gres/gpu(?::[^=,]+)?=(\d+)", _field(line, key))
        if m:
            return int(m.group(1))
    per_node = re.search(r"gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", _field(line, "TresPerNode"))
    nodes = _field(line, "NumNodes").split("-")[0]
    if per_node and nodes.isdigit():
        return int(per_node.group(1)) * int(nodes)
    return 0


def parse_job(line: str) -> JobInfo | None:
    """One `scontrol show job -o` line; None when it is not a job record."""
    job_id = _field(line, "JobId")
    if not job_id.isdigit():
        return None
    user = _field(line, "UserId").split("(")[0]
    nodes = _field(line, "NodeList")
    start = _ts(_field(line, "StartTime"))
    state = _field(line, "JobState")
    restarts = _field(line, "Restarts")
    return JobInfo(
        job_id=int(job_id),
        user=user,
        state=state,
        nodes="" if nodes in ("", "(null)") else nodes,
        gpus=_gpus(line),
        restarts=int(restarts) if restarts.isdigit() else 0,
        start_ts=start if state not in ("PENDING", "REQUEUED") else None,
        mail_user=_field(line, "MailUser").replace("(null)", ""),
        comment=_field(line, "Comment").replace("(null)", ""),
        partition=_field(line, "Partition"),
        reason=_field(line, "Reason"),
    )


class JobSource(Protocol):
    def jobs(self, ids: Iterable[int]) -> dict[int, JobInfo]: ...
    def pool_gpus(self, pool: str) -> int: ...


class SlurmJobs:
    """Jobs and partitions through Slurm's own commands; a partition's size is cached a while."""

    def __init__(self, slurm_conf: Path | None, timeout: float = 20.0, cache_seconds: float = 300.0) -> None:
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._timeout = timeout
        self._cache_seconds = cache_seconds
        self._sizes: dict[str, tuple[float, int]] = {}

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self._env, capture_output=True, text=True, timeout=self._timeout
        )

    def jobs(self, ids: Iterable[int]) -> dict[int, JobInfo]:
        """The jobs Slurm still knows (a job purged after it ended is left out): one call for
        every job (a storm's hundreds of jobs cost one scontrol, not one each)."""
        wanted = set(ids)
        if not wanted:
            return {}
        res = self._run("scontrol", "show", "job", "-o")
        if res.returncode != 0:
            why = res.stderr.strip()[:300]
            raise RuntimeError(f"scontrol show job: rc={res.returncode}: {why}")
        out: dict[int, JobInfo] = {}
        for line in res.stdout.splitlines():
            job = parse_job(line)
            if job is not None and job.job_id in wanted:
                out[job.job_id] = job
        return out

    def pool_gpus(self, pool: str) -> int:
        """GPUs of the pool's partition: its nodes' GPU GRES (`sinfo -p POOL -o "%D|%G"`: each
        group's node count x its gpu count); 0 when there is no such partition."""
        at, n = self._sizes.get(pool, (float("-inf"), 0))
        if time.monotonic() - at < self._cache_seconds:
            return n
        res = self._run("sinfo", "-h", "-p", pool, "-o", "%D|%G")
        n = pool_gpus_of(res.stdout) if res.returncode == 0 else 0
        self._sizes[pool] = (time.monotonic(), n)
        return n


def pool_gpus_of(sinfo: str) -> int:
    """Sum of nodes x GPUs over `%D|%G` lines ("6|gpu:h100:8", "2|gpu:8(S:0-1),shard:4")."""
    total = 0
    for line in sinfo.splitlines():
        count, _sep, gres = line.partition("|")
        m = re.search(r"(?:^|,)gpu(?::[A-Za-z0-9_.-]+)?:(\d+)", gres)
        if count.strip().isdigit() and m:
            total += int(count) * int(m.group(1))
    return total


def read_progress_file(path: Path | None, roots: Iterable[Path]) -> list[dict[str, Any]] | None:
    """The job's progress events, when its file lies under one of `roots` (the comment is the
    owner's text: nothing else is read); None when not allowed or not readable."""
    if path is None:
        return None
    try:
        real = path.resolve(strict=True)
    except OSError:
        return None
    if not any(real.is_relative_to(r.resolve()) for r in roots) or not real.is_file():
        return None
    try:
        with real.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - MAX_PROGRESS_BYTES))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    events: list[dict[str, Any]] = []
    for line in data.splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # a partial first line of a tail, or a line being written
        if isinstance(e, dict):
            events.append(e)
    return events
