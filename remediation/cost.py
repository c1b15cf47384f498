"""What a fault cost a training job, in GPU-hours, from the incident's timeline and the job's own
progress; and a pool's effective training time over a window.

One job hit by one fault loses

    gpus x (fault -> first step after resume)          the job is down: nothing trains
  + gpus x (time spent on the steps since the checkpoint it resumed from, before the fault)
                                                        work done again after the resume

The second term comes from the job's progress (examples/train.py writes progress.jsonl: `step`
events with their time, `start` with the step of the checkpoint it loaded, `first_step` after a
resume); without it only the first term is known and `recompute_s` is None. Effective training
time (the figure large-scale training is judged by) is 1 - lost GPU-hours / (the pool's GPUs x the
window), per pool.

Pure functions: the owner loop (remediation/owners.py) feeds them and journals their result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

COST_PHASE = "job_cost"  # the timeline entry (source runner) that holds one job's cost, as JSON


@dataclass(frozen=True)
class JobCost:
    job: int
    gpus: int
    fault_ts: float
    resumed_ts: float  # the job's first step after the resume (or its start, without progress)
    down_s: float  # fault -> resumed_ts
    recompute_s: float | None  # time the steps since the resumed checkpoint had taken; None: unknown
    ckpt_step: int | None  # the checkpoint step the job resumed from
    fault_step: int | None  # the last step the job reported before the fault
    pool: str = "?"

    @property
    def gpu_hours(self) -> float:
        return self.gpus * (self.down_s + (self.recompute_s or 0.0)) / 3600.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_hours": round(self.gpu_hours, 6)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobCost:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    def line(self) -> str:
        """One line for people: `job 12: 16 GPUs x (93.2 s down + 4.1 s recomputed) = 0.4324 GPU-h`."""
        redo = "recompute unknown" if self.recompute_s is None else f"{self.recompute_s:.1f} s recomputed"
        return (
            f"job {self.job}: {self.gpus} GPUs x ({self.down_s:.1f} s down + {redo})"
            f" = {self.gpu_hours:.4f} GPU-h"
        )


@dataclass(frozen=True)
class Progress:
    """What the job's progress says about one fault at `fault_ts`."""

    resumed_ts: float | None  # first `first_step` after the fault
    ckpt_step: int | None  # the step of the checkpoint the restart loaded (its `start` event)
    fault_step: int | None  # the last step reported before the fault
    recompute_s: float | None  # time from reaching ckpt_step to reaching fault_step, before the fault


def read_progress(events: Iterable[Mapping[str, Any]], fault_ts: float) -> Progress:
    """The resume and the lost work around the fault at `fault_ts`, from progress.jsonl events
    ({"ts", "event", "step", ...}); malformed events are skipped."""
    before: list[tuple[float, int]] = []  # (ts, step) of steps and checkpoints before the fault
    resumed_ts: float | None = None
    ckpt_step: int | None = None
    for e in events:
        ts, step, kind = e.get("ts"), e.get("step"), e.get("event")
        if not isinstance(ts, int | float) or not isinstance(step, int) or isinstance(step, bool):
            continue
        if ts < fault_ts:
            if kind in ("step", "first_step", "checkpoint", "start"):
                before.append((float(ts), step))
        elif kind == "start" and ckpt_step is None and int(e.get("restart") or 0) >= 1:
            ckpt_step = step
        elif kind == "first_step" and resumed_ts is None:
            resumed_ts = float(ts)
    fault_step = max((s for _, s in before), default=None)
    recompute: float | None = None
    if ckpt_step is not None and fault_step is not None and ckpt_step >= fault_step:
        recompute = 0.0  # a checkpoint at (or after: the SIGTERM one) the last step reported
    elif ckpt_step is not None and fault_step is not None:
        # the work past the checkpoint: from when the job first reached ckpt_step to its last step
        reached = [ts for ts, s in before if s >= ckpt_step]
        last = max((ts for ts, s in before if s == fault_step), default=None)
        if reached and last is not None:
            recompute = max(0.0, last - min(reached))
    return Progress(resumed_ts, ckpt_step, fault_step, recompute)


def job_cost(
    job: int,
    gpus: int,
    fault_ts: float,
    started_ts: float,
    progress: Progress | None,
    pool: str = "?",
) -> JobCost:
    """The job's cost; `started_ts` (Slurm's start of the requeued job) stands in for the first
    step after the resume when the progress has none."""
    p = progress or Progress(None, None, None, None)
    resumed = p.resumed_ts if p.resumed_ts is not None else started_ts
    return JobCost(
        job=job,
        gpus=gpus,
        fault_ts=fault_ts,
        resumed_ts=resumed,
        down_s=max(0.0, resumed - fault_ts),
        recompute_s=p.recompute_s,
        ckpt_step=p.ckpt_step,
        fault_step=p.fault_step,
        pool=pool,
    )


def effective_training_time(lost_gpu_hours: float, pool_gpus: int, window_s: float) -> float | None:
    """1 - lost / (GPUs x window), in [0, 1]; None when the pool's size is unknown."""
    if pool_gpus <= 0 or window_s <= 0:
        return None
    return max(0.0, 1.0 - lost_gpu_hours / (pool_gpus * window_s / 3600.0))


def lost_in_window(costs: Iterable[JobCost], now: float, window_s: float) -> dict[str, float]:
    """pool -> GPU-hours lost by faults within the window: the part of each job's down time
    inside [now - window, now] (its recomputed work counts when its fault does)."""
    start = now - window_s
    out: dict[str, float] = {}
    for c in costs:
        down = max(0.0, min(c.resumed_ts, now) - max(c.fault_ts, start))
        redo = (c.recompute_s or 0.0) if c.fault_ts >= start else 0.0
        if down or redo:
            out[c.pool] = out.get(c.pool, 0.0) + c.gpus * (down + redo) / 3600.0
    return out


class _Entry(Protocol):  # a journal TimelineEntry
    @property
    def phase(self) -> str: ...
    @property
    def detail(self) -> str: ...


def costs_from(timeline: Iterable[_Entry]) -> list[JobCost]:
    """The job costs an incident's timeline holds (its `job_cost` entries)."""
    out: list[JobCost] = []
    for e in timeline:
        if e.phase != COST_PHASE:
            continue
        try:
            out.append(JobCost.from_dict(json.loads(e.detail)))
        except (ValueError, TypeError):
            continue  # not ours: a cost entry is always written by the owner loop
    return out


def incident_cost(timeline: Iterable[_Entry]) -> dict[str, Any]:
    """What `autoheal incident show` and `incidents --json` print: the total and each job's."""
    costs = costs_from(timeline)
    return {
        "gpu_hours": round(sum(c.gpu_hours for c in costs), 6),
        "jobs": [c.as_dict() for c in costs],
    }
