"""Lending Slurm nodes to inference bursts (issue 35), measured two ways.

(a) On real nodes (`--bursts N`, 0 to skip): one burst lab (lab/burst.py: a pods lab of 2 real
GPU nodes, Slurm and the runner as pods, the runner pod's lender with the demo's timers), a job
holding gpu-1, then N bursts, each as `autoheal lab demo --scenario burst` runs it: the load
rises, the demo's autoscaler scales the inference Deployment up, its pods are Pending, the runner
pod's lender lends the idle node, the load generator's first answer from that node; the load
drops, the Deployment goes to 0, the node comes back and registers in Slurm. Between bursts the
bench waits out the node's cooldown. Prints p50 / p99 / max beside the targets:

    burst -> first request served on the lent node   <= 60 s   (idle node; a cloud autoscaler's
                                                                new GPU node takes minutes)
    burst over -> node back in Slurm                 <= return_after + cooldown + 30 s

(b) GPU-hours idle in the pool for a scripted day of demand, with and without lending: a
SIMULATION of the decision core, not of a cluster. remediation.lending.plan() (the lender's
own code) runs every `--step` seconds of a simulated clock over DayScript: a queue of one-node
training jobs arriving through the day and an inference Deployment's replicas per minute. The
world around it is a model: Slurm starts queued jobs FIFO on free training nodes, a requeued
job loses its work since its last checkpoint, inference pods land on lent nodes with free
GPUs (and a scale-down removes them from the emptiest node first), a returned node is back in
Slurm at once (the real one takes ~10 s to register). Without lending, inference has no GPU in
this pool (its demand is counted unserved). Idle = pool GPUs running neither a training job nor
an inference pod.

    .venv/bin/python bench/lending.py [--bursts 3] [--port-base 22800] [--name b-lending] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoheal.labels import LEND_REASON
from lab.stats import pct
from remediation.lending import Demand, Job, LendState, Policy, PoolNode, plan, update_idle

TARGET_SERVED_S = 60.0
RETURN_SLACK_S = 30.0


# --- (b) the scripted day ----------------------------------------------------------------------


@dataclass(frozen=True)
class DayScript:
    """A day of demand on one pool: `inference[m]` replicas wanted at minute m (each `pod_gpus`
    GPUs), `arrivals`: one-node training jobs as (minute, hours, priority)."""

    nodes: int
    gpus: int
    pod_gpus: int
    inference: tuple[int, ...]
    arrivals: tuple[tuple[int, float, int], ...]
    ckpt_minutes: float = 30.0  # a requeued job loses at most this much work

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus < 1 or not 1 <= self.pod_gpus <= self.gpus:
            raise ValueError(
                f"nodes/gpus/pod_gpus: need nodes >= 1, gpus >= 1, 1 <= pod_gpus <= gpus; got"
                f" {self.nodes}, {self.gpus}, {self.pod_gpus}"
            )
        if not self.inference:
            raise ValueError("inference: one entry per minute of the day, got none")
        bad = [a for a in self.arrivals if not (0 <= a[0] < len(self.inference) and a[1] > 0)]
        if bad:
            raise ValueError(f"arrivals: (minute within the day, hours > 0, priority); bad: {bad[:3]}")


def _hours(table: list[tuple[float, float, int]], minutes: int = 1440) -> list[int]:
    out = [0] * minutes
    for start, end, value in table:
        for m in range(int(start * 60), int(end * 60)):
            out[m] = value
    return out


def scripted_day() -> DayScript:
    """16 nodes x 8 GPUs. Inference (2-GPU replicas) follows the working day with two peaks and a
    15-minute flash burst at noon; training is a night backlog on every node (the morning's first
    inference finds no idle node: a busy one is lent and its job requeued), a morning and an
    afternoon batch of shorter jobs and an evening backlog, with gaps between them (the idle GPUs
    lending can use)."""
    inference = _hours(
        [
            (0, 7, 0),
            (7, 9, 2),
            (9, 11, 8),
            (11, 12, 16),
            (12, 12.25, 24),  # the flash burst
            (12.25, 14, 16),
            (14, 17, 8),
            (17, 20, 20),
            (20, 22, 6),
            (22, 24, 1),
        ]
    )
    arrivals: list[tuple[int, float, int]] = []
    arrivals += [(0, 7.5, 100)] * 16  # the night's backlog: every node for 7.5 h
    arrivals += [(8 * 60, 3.0, 50)] * 8  # the morning batch
    arrivals += [(13 * 60, 2.0, 50)] * 6  # the afternoon batch
    arrivals += [(19 * 60, 4.5, 100)] * 12  # the evening backlog, into the night
    return DayScript(nodes=16, gpus=8, pod_gpus=2, inference=tuple(inference), arrivals=tuple(arrivals))


DAY_POLICY = Policy(
    max_nodes=8,
    max_percent=50,
    min_training=2,
    cooldown=300,
    return_after=120,
    grace=120,
    on_grace="requeue",
)


@dataclass
class _SimJob:
    job_id: str
    left: float  # seconds of work left
    priority: int
    started: float = 0.0
    done_since_ckpt: float = 0.0


@dataclass
class _SimNode:
    name: str
    state: LendState = LendState.TRAINING
    drained: bool = False
    job: _SimJob | None = None
    pods: int = 0
    moved_at: float | None = None
    cordoned: bool = False


@dataclass
class DayResult:
    lending: bool
    idle_gpu_h: float = 0.0
    training_gpu_h: float = 0.0
    inference_gpu_h: float = 0.0
    unserved_inference_gpu_h: float = 0.0
    lost_training_gpu_h: float = 0.0  # work since the last checkpoint of requeued jobs
    requeues: int = 0
    lends: int = 0
    returns: int = 0
    max_away: int = 0  # most nodes off the training side at once
    min_training: int = 0  # fewest nodes on the training side at once
    queue_wait_h: float = 0.0  # job-hours spent queued
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.__dict__.items():
            out[k] = round(v, 2) if isinstance(v, float) else v
        return out


def _pool_nodes(nodes: list[_SimNode], script: DayScript) -> list[PoolNode]:
    out = []
    for n in nodes:
        in_slurm = n.state in (LendState.TRAINING, LendState.LENDING)
        jobs = (Job(n.job.job_id, n.job.priority),) if n.job else ()
        out.append(
            PoolNode(
                n.name,
                "pool",
                n.state,
                script.gpus,
                in_slurm=in_slurm,
                drained=in_slurm and n.drained,
                reason=LEND_REASON if n.drained else "",
                busy=n.job is not None,
                jobs=jobs,
                moved_at=n.moved_at,
                inference_gpus=n.pods * script.pod_gpus,
                inference_pods=n.pods,
            )
        )
    return out


def simulate_day(
    script: DayScript, policy: Policy = DAY_POLICY, lending: bool = True, step: float = 10.0
) -> DayResult:
    """One simulated day; `lending` False: the lender is off (inference finds no GPU in the pool)."""
    if step <= 0:
        raise ValueError(f"step: seconds > 0, got {step}")
    nodes = [_SimNode(f"n{i:02d}") for i in range(1, script.nodes + 1)]
    arrivals = sorted(script.arrivals)
    queue: deque[_SimJob] = deque()
    res = DayResult(lending=lending, min_training=script.nodes)
    idle_since: dict[str, float] = {}
    last_move: dict[str, float] = {}
    next_arrival = 0
    day = len(script.inference) * 60.0
    now = 0.0
    while now < day:
        minute = int(now // 60)
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= minute:
            _, hours, prio = arrivals[next_arrival]
            queue.append(_SimJob(f"j{next_arrival}", hours * 3600, prio))
            next_arrival += 1
        _slurm(nodes, queue, now)
        wanted = script.inference[minute]
        pending = _kube(nodes, wanted, script)
        if lending:
            view = _pool_nodes(nodes, script)
            update_idle(idle_since, view, now)
            p = plan(view, Demand(pending, pending * script.pod_gpus), policy, now, idle_since)
            for mv in p.moves:
                _apply(mv.verb, next(n for n in nodes if n.name == mv.node), queue, now, script, res)
                if mv.verb in ("lend", "return"):
                    if mv.node in last_move and now - last_move[mv.node] < policy.cooldown:
                        res.violations.append(f"{mv.node} moved twice within the cooldown at t={now:.0f}")
                    last_move[mv.node] = now
            _slurm(nodes, queue, now)  # a rolled-back or returned node takes queued work at once
            pending = _kube(nodes, wanted, script)
        _account(nodes, queue, pending, script, policy, res, step, now)
        for n in nodes:
            if n.job is not None:
                n.job.left -= step
                n.job.done_since_ckpt = (n.job.done_since_ckpt + step) % (script.ckpt_minutes * 60)
        now += step
    return res


def _slurm(nodes: list[_SimNode], queue: deque[_SimJob], now: float) -> None:
    """Jobs that finished leave; queued jobs start FIFO on free training nodes Slurm may use."""
    for n in nodes:
        if n.job is not None and n.job.left <= 0:
            n.job = None
    for n in nodes:
        if not queue:
            return
        if n.state is LendState.TRAINING and not n.drained and n.job is None:
            n.job = queue.popleft()
            n.job.started = now


def _kube(nodes: list[_SimNode], wanted: int, script: DayScript) -> int:
    """Inference pods onto lent, uncordoned nodes with free GPUs; a scale-down takes pods off the
    emptiest nodes first. Returns the pods left Pending."""
    placed = sum(n.pods for n in nodes)
    extra = placed - wanted
    for n in sorted((n for n in nodes if n.pods), key=lambda n: n.pods):
        if extra <= 0:
            break
        take = min(n.pods, extra)
        n.pods -= take
        extra -= take
    per_node = script.gpus // script.pod_gpus
    need = wanted - sum(n.pods for n in nodes)
    for n in nodes:
        if need <= 0:
            break
        if n.state is LendState.LENT and not n.cordoned:
            fit = min(per_node - n.pods, need)
            n.pods += fit
            need -= fit
    return max(need, 0)


def _apply(
    verb: str, n: _SimNode, queue: deque[_SimJob], now: float, script: DayScript, res: DayResult
) -> None:
    if verb == "lend":
        n.state, n.drained, n.moved_at = LendState.LENDING, True, now
        res.lends += 1
    elif verb == "drain":
        n.drained = True
    elif verb == "requeue" and n.job is not None:
        lost = n.job.done_since_ckpt
        res.lost_training_gpu_h += lost * script.gpus / 3600
        n.job.left += lost
        n.job.done_since_ckpt = 0.0
        queue.appendleft(n.job)
        n.job = None
        res.requeues += 1
    elif verb == "lent":
        n.state, n.drained = LendState.LENT, False
    elif verb == "rollback":
        n.state, n.drained = LendState.TRAINING, False
    elif verb == "return":
        n.state, n.cordoned, n.moved_at = LendState.RETURNING, True, now
        res.returns += 1
    elif verb == "evict":
        n.pods = 0
    elif verb == "returned":
        n.state, n.cordoned, n.drained = LendState.TRAINING, False, False
    elif verb == "resume":
        n.drained = False


def _account(
    nodes: list[_SimNode],
    queue: deque[_SimJob],
    pending: int,
    script: DayScript,
    policy: Policy,
    res: DayResult,
    step: float,
    now: float,
) -> None:
    h = step / 3600
    for n in nodes:
        if n.job is not None:
            res.training_gpu_h += script.gpus * h
        else:
            used = n.pods * script.pod_gpus
            res.inference_gpu_h += used * h
            res.idle_gpu_h += (script.gpus - used) * h
    res.unserved_inference_gpu_h += pending * script.pod_gpus * h
    res.queue_wait_h += len(queue) * h
    away = sum(1 for n in nodes if n.state is not LendState.TRAINING)
    training = script.nodes - away
    res.max_away = max(res.max_away, away)
    res.min_training = min(res.min_training, training)
    cap = math.floor(script.nodes * policy.max_percent / 100)
    if away > min(policy.max_nodes, cap):
        res.violations.append(
            f"{away} nodes away at t={now:.0f} (max_nodes {policy.max_nodes}, max_percent cap {cap})"
        )
    if away and training < policy.min_training:
        res.violations.append(
            f"{training} training nodes at t={now:.0f} (min_training {policy.min_training})"
        )


def day_figures(
    script: DayScript | None = None, policy: Policy = DAY_POLICY, step: float = 10.0
) -> dict[str, Any]:
    script = script or scripted_day()
    off = simulate_day(script, policy, lending=False, step=step)
    on = simulate_day(script, policy, lending=True, step=step)
    pool_gpu_h = script.nodes * script.gpus * len(script.inference) / 60
    return {
        "simulation": "remediation.lending.plan on a simulated clock (not a cluster)",
        "pool": {"nodes": script.nodes, "gpus_per_node": script.gpus, "gpu_hours": round(pool_gpu_h, 1)},
        "policy": {k: v for k, v in policy.__dict__.items() if k not in ("order", "pools")},
        "step_s": step,
        "without_lending": off.as_dict(),
        "with_lending": on.as_dict(),
    }


def print_day(fig: dict[str, Any]) -> None:
    off, on = fig["without_lending"], fig["with_lending"]
    pool = fig["pool"]
    print(
        f"(b) a scripted day, {pool['nodes']} nodes x {pool['gpus_per_node']} GPUs ="
        f" {pool['gpu_hours']} GPU-h ({fig['simulation']})"
    )
    rows = [
        ("idle GPU-h", "idle_gpu_h"),
        ("training GPU-h", "training_gpu_h"),
        ("inference GPU-h served", "inference_gpu_h"),
        ("inference GPU-h unserved", "unserved_inference_gpu_h"),
        ("training GPU-h lost to requeues", "lost_training_gpu_h"),
        ("training job-h queued", "queue_wait_h"),
        ("lends / returns / requeues", None),
    ]
    print(f"    {'':34s} {'without':>10s} {'with lending':>14s}")
    for label, key in rows:
        if key is None:
            a = "-"
            b = f"{on['lends']}/{on['returns']}/{on['requeues']}"
        else:
            a, b = f"{off[key]:.1f}", f"{on[key]:.1f}"
        print(f"    {label:34s} {a:>10s} {b:>14s}")
    saved = off["idle_gpu_h"] - on["idle_gpu_h"]
    print(
        f"    idle GPU-h saved by lending: {saved:.1f} ({100 * saved / max(off['idle_gpu_h'], 1e-9):.0f}%);"
        f" at most {on['max_away']} nodes away, never fewer than {on['min_training']} training;"
        f" limit violations: {len(on['violations'])}"
    )


# --- (a) bursts on real nodes ------------------------------------------------------------------


def lab_bursts(n: int, port_base: int, name: str, root: Path, timeout: float) -> dict[str, Any]:
    """N bursts on one burst lab (lab/burst.py's steps); each burst's phases and figures."""
    from lab import burst, procs
    from lab import lab as labmod
    from lab.config import load_lab

    cfg = burst.lab_config(name, port_base, root)
    existing = load_lab(name, root)
    reused = existing is not None and procs.running(existing.run_dir) and labmod.status(existing).healthy
    t0 = time.monotonic()
    labmod.up(cfg, lambda m: print(f"  lab: {m}", flush=True))
    up_s = time.monotonic() - t0
    trials: list[dict[str, Any]] = []
    s = None
    try:
        s = burst.prepare(cfg, cfg.run_dir / "bench", training="sleep")
        node = f"{cfg.pools[0].prefix}-2"
        for i in range(n):
            waited = burst.wait_cooled(cfg, node)
            b = s.scenario.burst(timeout)
            figs = b.figures()
            print(
                f"  burst {i + 1}/{n}: lent {b.node}; first served on it {figs['burst_to_first_served_s']} s"
                f" after the burst; back in Slurm {figs['burst_over_to_in_slurm_s']} s after it ended"
                f" (waited {waited:.0f} s for the cooldown first)",
                flush=True,
            )
            trials.append({"node": b.node, **figs, "phases": {k: v - b.t0 for k, v in b.seen.items()}})
    finally:
        if s is not None:
            s.side.run(["scancel", s.training_job])
            s.close()
        labmod.down(cfg)
    return {
        "lab_up_s": round(up_s, 1),
        "reused_lab": reused,
        "trials": trials,
        "lending_settings": cfg.lending,
    }


def line(name: str, xs: list[float], target: str) -> str:
    if not xs:
        return f"{name:46s}  (not reached)   target {target}"
    return (
        f"{name:46s}  p50 {pct(xs, 50):6.1f} s  p99 {pct(xs, 99):6.1f} s  max {max(xs):6.1f} s"
        f"   target {target}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bursts", type=int, default=3, help="bursts on real nodes (0: only the day simulation)")
    ap.add_argument("--port-base", type=int, default=22800)
    ap.add_argument("--name", default="b-lending", help="the lab's name")
    ap.add_argument("--root", type=Path, default=None, help="lab root (default: a new tmp dir)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per burst, seconds")
    ap.add_argument(
        "--step", type=float, default=10.0, help="the day simulation's step (the lender's interval)"
    )
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    a = ap.parse_args()
    if a.bursts < 0:
        ap.error("--bursts: 0 or more")
    out: dict[str, Any] = {}
    if a.bursts:
        root = a.root or Path(tempfile.mkdtemp(prefix="bench-lending-"))
        lab = lab_bursts(a.bursts, a.port_base, a.name, root, a.timeout)
        settings = lab["lending_settings"]
        back_target = settings["return_after_seconds"] + settings["cooldown_seconds"] + RETURN_SLACK_S
        served = [
            t["burst_to_first_served_s"] for t in lab["trials"] if t["burst_to_first_served_s"] is not None
        ]
        back = [
            t["burst_over_to_in_slurm_s"] for t in lab["trials"] if t["burst_over_to_in_slurm_s"] is not None
        ]
        up = "a running lab reused" if lab["reused_lab"] else f"lab up {lab['lab_up_s']} s"
        print(f"(a) {a.bursts} bursts on real nodes ({up}; lender timers {settings})")
        print(
            "    "
            + line("burst -> first request served on the lent node", served, f"<= {TARGET_SERVED_S:.0f} s")
        )
        print("    " + line("burst over -> node back in Slurm", back, f"<= {back_target:.0f} s"))
        out["bursts"] = {**lab, "served_s": served, "back_s": back}
    fig = day_figures(step=a.step)
    print_day(fig)
    out["day"] = fig
    if a.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
