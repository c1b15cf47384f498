"""Mean time to repair, per phase: N demo trials (a GPU dies under a training job) on one lab.

Brings up one lab (Slurm, Kubernetes with KWOK nodes, Prometheus, Alertmanager, simulator, pool
controller, runner), runs `lab.demo.trial` N times (XID 79 injected in the simulator, so
the whole Prometheus -> Alertmanager -> runner -> runbook path is measured), waits between trials
until the pool has backfilled its spares, and prints p50 / p99 / max of each phase (seconds after
the fault) beside the targets:

    fault -> fenced            <= 2 s (p99; issue 18)
    fenced -> spare promoted   <= 30 s
    fault -> job running       <= grace + 45 s
    fault -> first step        <= 15 s (p99; issue 18: training again within 15 s of the fault)
    anchor (managed service)   ~5 min to a healthy node, < 15 min end to end

The raw trials (each demo report, plus the runbook's per-task steps from the journal) are written
to `<run dir>/mttr-<time>.json`, whose path is printed. The slowest runbook tasks are listed too.

    .venv/bin/python bench/mttr.py [--trials 3] [--grace 30] [--port-base 24000] [--root DIR] [--name mttr]
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.console import Console

from autoheal.labels import SPARE_REASON
from lab import demo, pool, runner, slurm
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.stats import pct

ANCHOR_HEALTHY_S = 5 * 60
ANCHOR_END_TO_END_S = 15 * 60


def wait_settled(cfg: LabConfig, spares: int, timeout: float) -> float:
    """Until the pool holds its declared spares again, nothing is pending, the runner has no open
    incident and at least two active nodes are idle. Returns the seconds waited."""
    from remediation.journal import Journal

    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = pool.client_status(cfg)["pools"]
        pending = sum(len(p["pending"]) for p in st.values())
        states = slurm.node_states(cfg)
        spare = [n for n, s in states.items() if "DRAIN" in s["state"] and s["reason"] == SPARE_REASON]
        j = Journal(runner.journal_path(cfg))
        try:
            open_incidents = j.incidents(["pending", "admitted", "running", "held"])
        finally:
            j.close()
        if (
            not pending
            and len(spare) >= spares
            and not open_incidents
            and len(demo.HostSlurm(cfg).idle_nodes()) >= 2
        ):
            return time.monotonic() - t0
        time.sleep(1)
    raise SystemExit(f"the lab did not settle within {timeout:.0f}s between trials")


def run_steps(cfg: LabConfig, incident: str | None) -> list[dict[str, Any]]:
    """The runbook's per-task steps (task, duration) of the run(s) that handled `incident`."""
    from remediation.journal import Journal

    if incident is None:
        return []
    j = Journal(runner.journal_path(cfg))
    try:
        out = []
        for r in j.runs_of(incident):
            for s in j.steps(r.id):
                took = s["finished_at"] - s["started_at"] if s["started_at"] else None
                out.append(
                    {
                        "run": r.id,
                        "task": s["task"],
                        "status": s["status"],
                        "started_at": s["started_at"],
                        "finished_at": s["finished_at"],
                        "took_s": round(took, 3) if took is not None else None,
                    }
                )
        return out
    finally:
        j.close()


def line(name: str, xs: list[float], target: str) -> str:
    if not xs:
        return f"{name:28s}  (not reached)                              target {target}"
    return (
        f"{name:28s}  p50 {pct(xs, 50):7.2f} s  p99 {pct(xs, 99):7.2f} s  max {max(xs):7.2f} s"
        f"   target {target}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--grace", type=int, default=30, help="the lab's grace_seconds (SIGTERM -> requeue)")
    ap.add_argument("--port-base", type=int, default=24000)
    ap.add_argument("--provision-delay", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="per trial, seconds")
    ap.add_argument("--root", type=Path, default=None, help="lab root (default: a new tmp dir)")
    ap.add_argument("--name", default="mttr", help="the lab's name (two benches side by side need two)")
    ap.add_argument(
        "--settle-timeout", type=float, default=600.0, help="seconds for the lab to settle between trials"
    )
    a = ap.parse_args()
    root = a.root or Path(tempfile.mkdtemp(prefix="autoheal-mttr-"))
    spares = 2
    cfg = LabConfig(
        name=a.name,
        root=root,
        port_base=a.port_base,
        pools=[PoolConfig(size=4, spares=spares, headroom=a.trials + 2)],
        kube=True,
        runner=True,
        grace_seconds=a.grace,
        provision_delay=a.provision_delay,
    )
    quiet = Console(file=io.StringIO(), width=120)
    trials: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        labmod.up(cfg)
        up_s = time.monotonic() - t0
        demo.check_healthy(cfg)
        print(f"lab up (6 nodes, Kubernetes + runner): {up_s:.1f} s", flush=True)
        for i in range(a.trials):
            settle = wait_settled(cfg, spares, a.settle_timeout) if i else 0.0
            t = time.monotonic()
            try:
                rep = demo.trial(cfg, cfg.run_dir / f"trial-{i + 1}", quiet, quiet, a.timeout, live=False)
                rep["ok"] = True
            except Exception as exc:
                rep = {"ok": False, "error": str(exc)[:500]}
                rdir = cfg.run_dir / f"trial-{i + 1}" / "report.json"
                if rdir.exists():
                    rep.update(json.loads(rdir.read_text()))
            rep["trial"] = i + 1
            rep["wall_s"] = round(time.monotonic() - t, 2)
            rep["settle_before_s"] = round(settle, 2)
            rep["steps"] = run_steps(cfg, rep.get("incident"))
            trials.append(rep)
            seen = {p["phase"]: p["t_plus_s"] for p in rep.get("phases", []) if p["t_plus_s"] is not None}
            print(
                f"trial {i + 1}: {'ok' if rep['ok'] else 'FAILED ' + rep.get('error', '')[:120]}; "
                + ", ".join(f"{k} +{v:.1f}s" for k, v in seen.items()),
                flush=True,
            )
    finally:
        out = cfg.run_dir / f"mttr-{time.strftime('%Y%m%dT%H%M%S')}.json"
        if cfg.run_dir.exists():
            out.write_text(json.dumps({"grace_seconds": a.grace, "trials": trials}, indent=2))
        labmod.down(cfg)
    report(trials, a.grace)
    print(f"raw trials: {out}")


def report(trials: list[dict[str, Any]], grace: int) -> None:
    ok = [t for t in trials if t.get("phases")]
    per: dict[str, list[float]] = defaultdict(list)
    for t in ok:
        for p in t["phases"]:
            if p["t_plus_s"] is not None:
                per[p["phase"]].append(p["t_plus_s"])
    print(f"\n{len(trials)} trials ({sum(1 for t in trials if t.get('ok'))} resumed), grace {grace} s")
    print("phase (seconds after the fault)")
    for key, label in demo.PHASES:
        if key == "injected":
            continue
        print("  " + line(key, per.get(key, []), f"({label})"))
    print("targets")
    fenced = [t["fault_to_fenced_s"] for t in ok if t.get("fault_to_fenced_s") is not None]
    promoted = [
        t["fenced_to_spare_promoted_s"] for t in ok if t.get("fenced_to_spare_promoted_s") is not None
    ]
    running = [t["fault_to_job_running_s"] for t in ok if t.get("fault_to_job_running_s") is not None]
    first = per.get("first_step", [])
    resolved = per.get("resolved", [])
    ready = per.get("replacement_ready", [])
    print("  " + line("fault -> fenced", fenced, "<= 2 s p99"))
    print("  " + line("fenced -> spare promoted", promoted, "<= 30 s"))
    print("  " + line("fault -> job running", running, f"<= grace + 45 = {grace + 45} s"))
    anchor = f"<= 15 s p99 (anchor < {ANCHOR_END_TO_END_S} s)"
    print("  " + line("fault -> first step resumed", first, anchor))
    print("  " + line("fault -> replacement ready", ready, f"(anchor ~{ANCHOR_HEALTHY_S} s)"))
    print("  " + line("fault -> incident resolved", resolved, "(whole runbook)"))
    slow: dict[str, list[float]] = defaultdict(list)
    for t in ok:
        for s in t.get("steps", []):
            if s["took_s"] is not None:
                slow[s["task"]].append(s["took_s"])
    if slow:
        print("slowest runbook tasks (journal steps; median over trials)")
        ranked = sorted(slow.items(), key=lambda kv: -pct(kv[1], 50))[:10]
        for task, xs in ranked:
            print(f"  {pct(xs, 50):7.2f} s  {task}")


if __name__ == "__main__":
    main()
