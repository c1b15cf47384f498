"""`autoheal lab demo --fault link-flap`: a flapping InfiniBand link slows a training job; autoheal
drains the node without killing the job, and once the job has finished it validates the node
and gives it back (issue 36).

A host lab comes up (Slurm, Prometheus, Alertmanager, the simulator, each node's watcher reading
its sysfs, the runner; no Kubernetes needed). The example training job runs on two nodes. The
simulator flaps the first node's port once - below the threshold: nothing happens - and then
past it; from then on the demo only watches and prints each phase as it happens:

    flap injected -> NodeDegraded (the node's watcher) -> webhook received (runner) -> DRAINING
    (Slurm DRAIN, the job still RUNNING and still stepping) -> job finished -> validation queued
    -> validated -> returned to service (Slurm IDLE, no DRAIN)

and a table of the phases with their time since the fault; report.json goes to the report dir.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from autoheal.errors import LabError
from autoheal.faults import FaultClass, load_fault_catalog
from lab import runner, slurm
from lab.config import LabConfig, PoolConfig
from lab.demo import HostSlurm, demo_lab, job_nodes

STEPS = 400  # the job's length: 40 s at 0.1 s a step, long enough to be drained while it runs
PHASES: list[tuple[str, str]] = [
    ("injected", "link flaps injected (fault)"),
    ("alert", "NodeDegraded (node watcher)"),
    ("received", "webhook received (runner)"),
    ("draining", "DRAINING: Slurm DRAIN, job running"),
    ("stepping", "job still stepping after the drain"),
    ("job_end", "job finished"),
    ("validation_queued", "node idle: validation queued"),
    ("validated", "validated (health check)"),
    ("returned", "returned to service (IDLE)"),
]


def lab_config(name: str, port_base: int, root: Path | None) -> LabConfig:
    """A host lab of four nodes: a two-node job, two nodes for the rest; the runner's grace short."""
    kw: dict[str, Any] = {"root": root} if root else {}
    return LabConfig(
        name=name,
        port_base=port_base,
        pools=[PoolConfig(size=4, spares=0, headroom=1)],
        kube=False,
        runner=True,
        grace_seconds=30,
        provision_delay=1,
        **kw,
    )


@dataclass
class Watch:
    cfg: LabConfig
    job: str
    node: str
    ckpt: Path
    t_fault: float = 0.0
    seen: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)  # the job's step at a phase

    def step(self) -> int:
        p = self.ckpt / "progress.jsonl"
        events = [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
        return max((e["step"] for e in events if e.get("event") in ("step", "first_step")), default=0)

    def mark(self, phase: str, console: Console, at: float | None = None) -> None:
        """Record a phase once: when it happened (the journal's or Alertmanager's time where
        they say, else now) and the job's step then."""
        if phase not in self.seen:
            self.seen[phase] = time.time() if at is None else at
            self.steps[phase] = self.step()
            label = dict(PHASES)[phase]
            console.print(
                f"  +{self.seen[phase] - self.t_fault:6.2f}s  {label}  (job step {self.steps[phase]})"
            )

    def poll(self, console: Console) -> None:
        if "alert" not in self.seen and (since := self._alerting()) is not None:
            self.mark("alert", console, since)
        words = set(slurm.node_states(self.cfg).get(self.node, {}).get("state", []))  # state + flags
        self._journal(console)
        job = self._job_state()
        if "DRAIN" in words and job == "RUNNING":
            self.mark("draining", console)
        if "draining" in self.seen and job == "RUNNING" and self.step() > self.steps["draining"]:
            self.mark("stepping", console)
        if "draining" in self.seen and job in ("COMPLETED", "GONE"):
            self.mark("job_end", console)
        if "job_end" in self.seen and "IDLE" in words and "DRAIN" not in words:
            self.mark("returned", console)

    def _alerting(self) -> float | None:
        """When the node's NodeDegraded alert started, once Alertmanager has it."""
        from lab.demo import _parse_ts

        alerts = httpx.get(self.cfg.url("alertmanager", "/api/v2/alerts"), timeout=2).json()
        for a in alerts:
            if a["labels"].get("alertname") == "NodeDegraded" and a["labels"].get("Hostname") == self.node:
                return max(_parse_ts(a["startsAt"]), self.t_fault)
        return None

    def _job_state(self) -> str:
        out = slurm.run(self.cfg, ["squeue", "-h", "-j", self.job, "-o", "%T"]).strip()
        return out or "GONE"

    def _journal(self, console: Console) -> None:
        j = runner.open_journal(self.cfg)
        if j is None:
            return
        try:
            mine = [i for i in j.incidents() if i.node == self.node and i.opened_at >= self.t_fault - 1]
            for inc in mine:
                at = {e.phase: e.ts for e in j.timeline(inc.id) if e.status == "ok"}
                if inc.source != "return":
                    self.mark("received", console, inc.opened_at)
                    if "validation_queued" in at:
                        self.mark("validation_queued", console, at["validation_queued"])
                elif "validated" in at:
                    self.mark("validated", console, at["validated"])
        finally:
            j.close()


def run(
    cfg: LabConfig, keep: bool, console: Console, out: Console, report_dir: Path | None, timeout: float
) -> dict[str, Any]:
    """Up, the story, the table; down unless `keep`."""
    with demo_lab(cfg, keep, console) as cfg:
        report = story(cfg, report_dir or cfg.run_dir / "demo", console, timeout)
        out.print(_table(report))
        return report


def story(cfg: LabConfig, rdir: Path, console: Console, timeout: float, steps: int = STEPS) -> dict[str, Any]:
    """The demo on a running host lab: the job, the flaps, every phase watched; the report."""
    side = HostSlurm(cfg)
    ckpt, train_out = side.outputs(rdir)
    job = side.submit(ckpt, train_out, f"--step-time 0.1 --ckpt-every 50 --steps {steps}")
    deadline = time.monotonic() + 90
    while len(nodes := job_nodes(side, job)) != 2:
        if time.monotonic() > deadline:
            raise LabError(f"demo: training job {job} did not start on two nodes within 90 s")
        time.sleep(0.25)
    w = Watch(cfg, job, nodes[0], ckpt)
    while w.step() < 20:  # training for real before the fault (the watcher learns the port meanwhile)
        if time.monotonic() > deadline + 60:
            raise LabError(f"demo: training job {job} made no progress (see {train_out})")
        time.sleep(0.25)
    console.print(f"training job {job} at step {w.step()} on {', '.join(nodes)}; flapping {w.node}'s port")
    threshold = load_fault_catalog().require(FaultClass.LINK_FLAP).threshold
    _flap(cfg, w.node, 1)
    time.sleep(3.0)
    if "DRAIN" in slurm.node_states(cfg)[w.node].get("state", []):
        raise LabError("demo: one flap, below the threshold, drained the node")
    console.print(f"one flap (threshold {threshold}): no action, as it should be")
    w.t_fault = time.time()
    _flap(cfg, w.node, threshold - 1)
    w.mark("injected", console)
    end = time.monotonic() + timeout
    while "returned" not in w.seen:
        if time.monotonic() > end:
            raise LabError(f"demo: the node was not returned within {timeout:.0f}s; seen {sorted(w.seen)}")
        w.poll(console)
        time.sleep(0.25)
    report = {
        "fault": "link_flap",
        "node": w.node,
        "job": job,
        "threshold": threshold,
        "phases": [
            {"phase": k, "label": label, "t": w.seen[k] - w.t_fault, "step": w.steps[k]}
            for k, label in sorted(PHASES, key=lambda p: w.seen.get(p[0], 0.0))
            if k in w.seen
        ],
    }
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "report.json").write_text(json.dumps(report, indent=2))
    return report


def _flap(cfg: LabConfig, node: str, flaps: int) -> None:
    r = httpx.post(cfg.url("simulator", "/v1/link"), json={"node": node, "flaps": flaps}, timeout=5)
    if r.status_code != 200:
        raise LabError(f"demo: the simulator refused the flap: {r.text[:200]}")


def _table(report: dict[str, Any]) -> Table:
    t = Table(title=f"link flap on {report['node']}: the job ran on, the node came back")
    t.add_column("phase")
    t.add_column("since the fault", justify="right")
    t.add_column("job step", justify="right")
    for p in report["phases"]:
        t.add_row(p["label"], f"{p['t']:.2f}s", str(p["step"]))
    return t
