"""`autoheal lab demo`: a GPU dies during training and the job resumes by itself.

The lab comes up (Slurm, Kubernetes, Prometheus, Alertmanager, simulator, pool controller, runner),
a checkpointing PyTorch job is submitted with sbatch on two GPU nodes while another team's job fills
the rest of the pool, XID 79 is raised on a GPU of the training job's first node, and from then on
nothing is touched by hand: the demo only watches. It shows a live timeline until the job has
trained past its pre-fault step, then prints the per-phase table and writes a report (JSON + PNG).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autoheal.errors import LabError
from autoheal.paths import data_root
from lab import lab as labmod
from lab import procs, runner, slurm
from lab.config import LabConfig
from lab.sink import WebhookSink
from remediation.cost import JobCost, incident_cost

EXAMPLES = data_root() / "examples"
DEMO_GPU, DEMO_XID = 3, 79
DEAD_GPU_CHECKS = 100  # a pods demo's GPU fails every health check after the fault (it is dead)

# (key, label): the phases of one incident in the order of docs/architecture.md, "The flow of one fault"
PHASES: list[tuple[str, str]] = [
    ("injected", "XID 79 injected (fault)"),
    ("alert_fired", "alert fired (Prometheus)"),
    ("received", "webhook received (runner)"),
    ("fenced", "fenced (Slurm drain + cordon)"),
    ("jobs_signalled", "jobs signalled (SIGTERM)"),
    ("checkpoint", "checkpoint written"),
    ("spare_promoted", "spare promoted"),
    ("requeued", "jobs requeued"),
    ("job_running", "job running again"),
    ("first_step", "first step after resume"),
    ("drained", "node drained (Kubernetes)"),
    ("replacement_ready", "replacement ready (backfill)"),
    ("resolved", "incident resolved"),
]


class HostSlurm:
    """The lab's own Slurm on this host (a host lab): its client commands, its checkpoint dir."""

    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg

    def run(self, argv: list[str], timeout: float = 30) -> str:
        return slurm.run(self.cfg, argv, timeout=timeout)

    def idle_nodes(self) -> list[str]:
        states = slurm.node_states(self.cfg)
        return sorted(n for n, s in states.items() if s["state"] == ["IDLE"])

    def outputs(self, rdir: Path) -> tuple[Path, Path]:
        """The checkpoint dir and the job's output file, emptied: a rerun starts from step 0."""
        return _fresh_outputs(rdir)

    def submit(self, ckpt: Path, out: Path, args: str) -> str:
        return submit(self.cfg, ckpt, out, args)

    def close(self) -> None:
        pass


class PodSlurm:
    """Slurm as the stack's pods (a pods lab): what a researcher does, over ssh to the login
    Service (lab.login): their scripts copied into their home, `sbatch` there, the checkpoints on
    the cluster's shared /checkpoints volume, which the demo reads where the lab's provisioner
    keeps it on this host."""

    HOME_DIR = "autoheal-demo"  # in the researcher's home

    def __init__(self, cfg: LabConfig) -> None:
        from lab import login

        self.cfg = cfg
        self.login = login.Login(cfg)
        home = f"/home/{login.USER}/{self.HOME_DIR}"
        self.home = home
        login.upload(
            self.login, {f"{home}/{f}": EXAMPLES / f for f in ("train.py", "checkpoint.py", "train.sbatch")}
        )

    def run(self, argv: list[str], timeout: float = 30) -> str:
        import shlex

        return self.login.run(shlex.join(argv), timeout=timeout)

    def idle_nodes(self) -> list[str]:
        rows = [line.split() for line in self.run(["sinfo", "-h", "-N", "-o", "%N %t"]).splitlines()]
        return sorted({r[0] for r in rows if len(r) == 2 and r[1] == "idle"})

    def outputs(self, rdir: Path) -> tuple[Path, Path]:
        """A fresh folder of the shared /checkpoints volume (seen here through its host dir)."""
        run = f"demo-{int(time.time() * 1000)}"
        self.ckpt_path = f"/checkpoints/{run}"
        self.run(["mkdir", "-p", self.ckpt_path])
        host = _volume_dir(self.cfg, "slurm", "slurm-checkpoints") / run
        rdir.mkdir(parents=True, exist_ok=True)
        return host, host / "train.out"

    def submit(self, ckpt: Path, out: Path, args: str) -> str:
        from lab.stack import job_environment

        env = {
            **job_environment(),
            "CKPT_DIR": self.ckpt_path,
            "AUTOHEAL_EXAMPLES": self.home,
            "TRAIN_ARGS": args,
        }
        import shlex

        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        cmd = f"cd {self.home} && {exports} sbatch --parsable -o {self.ckpt_path}/train.out train.sbatch"
        return self.login.run(cmd).strip().split(";")[0]

    def close(self) -> None:
        self.login.close()


SlurmSide = HostSlurm | PodSlurm


def slurm_side(cfg: LabConfig) -> SlurmSide:
    return PodSlurm(cfg) if cfg.pods else HostSlurm(cfg)


def _volume_dir(cfg: LabConfig, namespace: str, claim: str) -> Path:
    """The host directory behind a claim (the lab's provisioner backs each volume with one)."""
    from lab import controlplane

    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        pvc = http.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}").json()
        pv = http.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}").json()
    return Path(pv["spec"]["hostPath"]["path"])


@dataclass
class Watch:
    cfg: LabConfig
    ckpt: Path
    job: str
    node: str
    side: SlurmSide
    t_fault: float = 0.0
    pre_fault_step: int = 0
    step: int = 0
    seen: dict[str, float] = field(default_factory=dict)
    incident: str | None = None
    requeued_nodes: str = ""
    resumed_ok: bool = False
    ckpt_step: int = 0

    def progress(self) -> list[dict[str, Any]]:
        p = self.ckpt / "progress.jsonl"
        if not p.exists():
            return []
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]

    def poll(self) -> None:
        events = self.progress()
        steps = [e["step"] for e in events if e["event"] in ("step", "first_step")]
        self.step = max(steps, default=0)
        after = [e for e in events if e["ts"] >= self.t_fault]
        for e in after:
            # the checkpoint of the fault: a SIGTERM checkpoint before the job resumed
            if e["event"] == "checkpoint" and e.get("reason") == "sigterm" and "first_step" not in self.seen:
                self.seen.setdefault("checkpoint", e["ts"])
                self.ckpt_step = e["step"]
            if e["event"] == "first_step":
                self.seen.setdefault("first_step", e["ts"])
        if "first_step" in self.seen and self.step > max(self.pre_fault_step, self.ckpt_step):
            self.resumed_ok = True
        if "replacement_ready" not in self.seen and "fenced" in self.seen:
            self._pool()
        if "alert_fired" not in self.seen:
            self._alert()
        self._journal()
        if "requeued" in self.seen or "checkpoint" in self.seen:
            self._job()

    def _alert(self) -> None:
        data = httpx.get(self.cfg.url("prometheus", "/api/v1/alerts"), timeout=2).json()
        for a in data["data"]["alerts"]:
            if a["labels"].get("Hostname") == self.node and a["state"] == "firing":
                # activeAt is when the rule first matched: the alert fired then
                ts = _parse_ts(a["activeAt"])
                self.seen["alert_fired"] = max(ts, self.t_fault)

    def _journal(self) -> None:
        if not self.t_fault:
            return  # not injected yet: an earlier incident on this node is not this fault's
        j = runner.open_journal(self.cfg)  # SQLite or the lab's PostgreSQL
        if j is None:
            return
        try:
            if self.incident is None:
                for inc in j.incidents():
                    if inc.node == self.node and inc.opened_at >= self.t_fault - 1:
                        self.incident = inc.id
            if self.incident is None:
                return
            for entry in j.timeline(self.incident):
                if entry.status == "ok":
                    self.seen.setdefault(entry.phase, entry.ts)
            rec = j.incident(self.incident)
            if rec is not None and rec.closed_at:
                self.seen.setdefault("resolved", rec.closed_at)
        finally:
            j.close()

    def _job(self) -> None:
        if "job_running" in self.seen:
            return
        out = self.side.run(["scontrol", "show", "job", self.job, "-o"], timeout=10)
        state = re.search(r"JobState=(\S+)", out)
        restarts = re.search(r"Restarts=(\d+)", out)
        if state and state.group(1) == "RUNNING" and restarts and int(restarts.group(1)) >= 1:
            self.seen["job_running"] = time.time()
            nodes = re.search(r" NodeList=(\S+)", out)
            self.requeued_nodes = nodes.group(1) if nodes else ""

    def rows(self) -> list[tuple[str, float | None]]:
        return [(label, self.seen.get(key)) for key, label in PHASES]

    def table(self) -> Table:
        t = Table(title=f"incident timeline: XID {DEMO_XID} on {self.node} GPU {DEMO_GPU}")
        t.add_column("phase")
        t.add_column("t+ (s)", justify="right")
        t.add_column("delta (s)", justify="right")
        prev = self.t_fault
        for label, ts in self.rows():
            if ts is None:
                t.add_row(label, "[dim]...[/dim]", "")
                continue
            t.add_row(label, f"{ts - self.t_fault:6.2f}", f"{max(0.0, ts - prev):6.2f}")
            prev = max(prev, ts)
        return t

    def done(self) -> bool:
        """Resumed and trained past both the step of the fault and the checkpoint it resumed from."""
        return self.resumed_ok

    def _pool(self) -> None:
        from lab import pool

        events = pool.client_status(self.cfg)["events"]
        retired = [e for e in events if e["event"] == "retired" and e["node"] == self.node]
        if retired:
            ready = [e for e in events if e["event"] == "replacement_ready" and e["ts"] >= retired[0]["ts"]]
            if ready:
                self.seen["replacement_ready"] = ready[0]["ts"]


def _parse_ts(s: str) -> float:
    from datetime import datetime

    s = re.sub(r"(\.\d{6})\d*", r"\1", s.replace("Z", "+00:00"))
    return datetime.fromisoformat(s).timestamp()


def submit(cfg: LabConfig, ckpt: Path, out: Path, args: str) -> str:
    env = dict(
        os.environ,
        **cfg.slurm_env(),
        CKPT_DIR=str(ckpt),
        PYTHON=sys.executable,
        AUTOHEAL_EXAMPLES=str(EXAMPLES),
        TRAIN_ARGS=args,
    )
    import subprocess

    # the job's progress file, named in its comment: the runner costs the fault from it
    comment = f"--comment=progress={ckpt.resolve() / 'progress.jsonl'}"
    res = subprocess.run(
        ["sbatch", "--parsable", comment, "-o", str(out), str(EXAMPLES / "train.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return res.stdout.strip().split(";")[0]


def job_nodes(side: SlurmSide, job: str) -> list[str]:
    out = side.run(["scontrol", "show", "job", job, "-o"])
    m = re.search(r" NodeList=(\S+)", out)
    if not m or m.group(1) == "(null)":
        return []
    return side.run(["scontrol", "show", "hostnames", m.group(1)]).split()


@contextmanager
def demo_lab(cfg: LabConfig, keep: bool, console: Console, healthy_note: str = "") -> Iterator[LabConfig]:
    """Every demo's frame: the lab up and healthy (the time said), then down unless `keep`."""
    t_start = time.monotonic()
    cfg = labmod.up(cfg, lambda m: console.print(f"[dim]lab[/dim] {m}"))
    try:
        check_healthy(cfg)
        console.print(f"lab healthy after {time.monotonic() - t_start:.1f}s{healthy_note}")
        yield cfg
    finally:
        if not keep:
            labmod.down(cfg)
            console.print("lab down (use --keep to leave it up and explore)")


def run_demo(
    cfg: LabConfig,
    keep: bool,
    console: Console,
    out: Console,
    report_dir: Path | None = None,
    timeout: float = 600,
) -> dict[str, Any]:
    with demo_lab(cfg, keep, console) as cfg:
        # a pods lab's `up` ran `pulumi up` itself (its Slurm and runner are what the stack declares)
        stack_up = _pods_stack_seconds(cfg) if cfg.pods else _pulumi_up(cfg, console)
        report = trial(cfg, report_dir or cfg.run_dir / "demo", console, out, timeout, cleanup=not keep)
        report["pulumi_up_s"] = stack_up
        return report


def _pods_stack_seconds(cfg: LabConfig) -> float | None:
    path = cfg.run_dir / "pulumi" / "up.json"
    return float(json.loads(path.read_text())["seconds"]) if path.exists() else None


def _pulumi_up(cfg: LabConfig, console: Console) -> float | None:
    """`pulumi up` of the lab stack (pools, Slurm, monitoring, runner objects) when the engine is built."""
    try:
        from lab import stack
    except ImportError:
        return None
    if not stack.available():
        console.print(
            "[yellow]pulumi engine not built: skipping `pulumi up` (scripts/build-tools.sh)[/yellow]"
        )
        return None
    t0 = time.monotonic()
    console.print("pulumi up of the lab stack (declares pools, Slurm, monitoring, runner)")
    summary = stack.up(cfg)
    took = time.monotonic() - t0
    console.print(f"pulumi up: {summary} in {took:.1f}s")
    return took


def check_healthy(cfg: LabConfig) -> None:
    st = labmod.status(cfg)
    if not st.healthy:
        bad = ", ".join(s.name for s in st.services if not s.healthy)
        raise LabError(f"demo: lab is not healthy ({bad}); see `autoheal lab status`")
    if "runner" not in {s.name for s in st.services}:
        raise LabError("demo: the remediation runner is not running in this lab")


def trial(
    cfg: LabConfig,
    rdir: Path,
    console: Console,
    out: Console,
    timeout: float = 600,
    cleanup: bool = True,
    live: bool = True,
) -> dict[str, Any]:
    """One fault on a running lab: submit, wait for progress, inject, watch until resumed."""
    side = slurm_side(cfg)
    try:
        return _trial(cfg, side, rdir, console, out, timeout, cleanup, live)
    finally:
        side.close()


def _trial(
    cfg: LabConfig,
    side: SlurmSide,
    rdir: Path,
    console: Console,
    out: Console,
    timeout: float,
    cleanup: bool,
    live: bool,
) -> dict[str, Any]:
    ckpt, train_out = side.outputs(rdir)
    inbox = None if cfg.pods else WebhookSink(cfg.port("owner-inbox")).start()
    try:
        return _trial_job(cfg, side, rdir, console, out, timeout, cleanup, live, inbox, ckpt, train_out)
    finally:
        if inbox is not None:
            inbox.stop()


def _trial_job(
    cfg: LabConfig,
    side: SlurmSide,
    rdir: Path,
    console: Console,
    out: Console,
    timeout: float,
    cleanup: bool,
    live: bool,
    inbox: WebhookSink | None,
    ckpt: Path,
    train_out: Path,
) -> dict[str, Any]:
    job = side.submit(ckpt, train_out, "--step-time 0.1 --ckpt-every 100")
    how = "over ssh to the login pod" if cfg.pods else "on this host"
    console.print(f"submitted training job {job} (sbatch examples/train.sbatch {how}, 2 nodes x 8 GPUs)")
    procs.wait_until(
        lambda: len(job_nodes(side, job)) == 2, 90, "demo: the training job to start", interval=0.25
    )
    nodes = job_nodes(side, job)
    filler = _fill_pool(side)
    w = Watch(cfg, ckpt, job, nodes[0], side)

    def progressed() -> bool:
        w.poll()
        return w.step >= 60

    try:
        procs.wait_until(progressed, 120, "demo: training progress", interval=0.25)
        where = f"{w.node} GPU {DEMO_GPU}"
        if cfg.pods:
            # the GPU is really dead: the reboot does not bring it back, so its node is retired
            # and the pool brings a new real node, whose slurmd pod joins Slurm as a spare
            from lab import ladder

            ladder.faults(cfg, w.node, health_failures=DEAD_GPU_CHECKS)
            console.print(f"{where} will stay dead after a reboot: validation fails, the node is replaced")
        console.print(f"training on {', '.join(nodes)}: step {w.step}; injecting XID {DEMO_XID} on {where}")
        w.t_fault = time.time()
        w.seen["injected"] = w.t_fault
        labmod.inject(cfg, w.node, DEMO_GPU, DEMO_XID)
        w.pre_fault_step = w.step
        _watch(w, job, timeout, console, live)
        w.poll()
        news = _owner_news(cfg, inbox, w) if inbox is not None else {}
    finally:
        if w.node in labmod.current_nodes(cfg):
            labmod.inject(cfg, w.node, None, None)
        if filler:
            side.run(["scancel", filler])
        if cleanup:
            side.run(["scancel", job])
    out.print(w.table())
    report = _report(w, rdir, nodes, news)
    for msg in report["owner_messages"]:
        out.print(Text(f"told {msg['to']['address']} ({', '.join(msg['kinds'])}): {msg['text']}"))
    for line in report["cost_lines"]:
        out.print(Text(f"cost: {line}"))
    out.print(f"report: {report['json']}  chart: {report['png']}")
    if not w.done():
        raise LabError(f"demo: the job did not resume within {timeout:.0f}s; see {train_out}")
    return report


OWNER_NEWS_WAIT_S = 30.0  # after the job resumed: the owner loop's resume message and the cost


def _owner_news(cfg: LabConfig, inbox: WebhookSink, w: Watch) -> dict[str, Any]:
    """What the runner told the job's owner (the inbox's deliveries for the job), waited for until
    the resume message came, and the incident's cost from the journal (remediation/cost.py)."""

    def mine() -> list[dict[str, Any]]:
        return [d.payload for d in inbox.deliveries if int(w.job) in d.payload.get("jobs", [])]

    deadline = time.monotonic() + OWNER_NEWS_WAIT_S
    while w.done() and time.monotonic() < deadline:
        if any("resumed" in m.get("kinds", []) for m in mine()):
            break
        time.sleep(0.5)
    cost: dict[str, Any] = {"gpu_hours": None, "jobs": []}
    j = runner.open_journal(cfg) if w.incident else None
    if j is not None and w.incident:
        try:
            cost = incident_cost(j.timeline(w.incident))
        finally:
            j.close()
    return {"owner_messages": mine(), "cost": cost}


def _fresh_outputs(rdir: Path) -> tuple[Path, Path]:
    """The checkpoint dir and the job's output file, emptied: a rerun starts from step 0."""
    rdir.mkdir(parents=True, exist_ok=True)
    ckpt = rdir / "ckpt"
    if ckpt.is_dir():
        for f in ckpt.iterdir():
            f.unlink()
    train_out = rdir / "train.out"
    train_out.unlink(missing_ok=True)
    return ckpt, train_out


def _fill_pool(side: SlurmSide) -> str | None:
    """Another team's job on every idle node, so the requeued job needs the promoted spare."""
    others = side.idle_nodes()
    if not others:
        return None
    argv = ["sbatch", "--parsable", "-N", str(len(others)), "--gres=gpu:8", "-J", "other-team"]
    argv += ["--no-requeue", "-o", "/dev/null", "--wrap", "sleep 3600"]
    return side.run(argv).strip()


def _watch(w: Watch, job: str, timeout: float, console: Console, live: bool) -> None:
    deadline = time.monotonic() + timeout

    def finished() -> bool:
        # the job trained past its pre-fault step, and the incident closed (or we waited long enough)
        return w.done() and ("resolved" in w.seen or time.monotonic() > deadline - timeout / 2)

    if not live:
        while not finished() and time.monotonic() < deadline:
            w.poll()
            time.sleep(0.25)
        return
    with Live(console=console, refresh_per_second=4) as view:
        while not finished() and time.monotonic() < deadline:
            w.poll()
            status = Text(
                f"job {job}: step {w.step} (pre-fault {w.pre_fault_step})  "
                f"incident {w.incident or '-'}  t+{time.time() - w.t_fault:5.1f}s"
            )
            view.update(Group(w.table(), status))
            time.sleep(0.25)


def _report(w: Watch, rdir: Path, nodes: list[str], news: dict[str, Any]) -> dict[str, Any]:
    phases = [
        {
            "phase": key,
            "label": label,
            "ts": w.seen.get(key),
            "t_plus_s": round(w.seen[key] - w.t_fault, 3) if key in w.seen else None,
        }
        for key, label in PHASES
    ]
    steps = [
        (e["ts"] - w.t_fault, e["step"], e["event"])
        for e in w.progress()
        if e["event"] in ("start", "step", "first_step")
    ]
    data = {
        "job": w.job,
        "nodes_before": nodes,
        "nodes_after": w.requeued_nodes,
        "faulty_node": w.node,
        "incident": w.incident,
        "pre_fault_step": w.pre_fault_step,
        "final_step": w.step,
        "phases": phases,
        "fault_to_fenced_s": _delta(w, "fenced"),
        "fault_to_job_running_s": _delta(w, "job_running"),
        "fenced_to_spare_promoted_s": (
            round(w.seen["spare_promoted"] - w.seen["fenced"], 3)
            if "spare_promoted" in w.seen and "fenced" in w.seen
            else None
        ),
        # what the job's owner was told, and what the fault cost (the runner's owner loop)
        "owner_messages": news.get("owner_messages", []),
        "cost": news.get("cost", {"gpu_hours": None, "jobs": []}),
        "cost_lines": [JobCost.from_dict(c).line() for c in news.get("cost", {}).get("jobs", [])],
    }
    js = rdir / "report.json"
    js.write_text(json.dumps(data, indent=2))
    png = rdir / "timeline.png"
    _chart(phases, steps, png, w)
    return {"json": str(js), "png": str(png), **data}


def _delta(w: Watch, key: str) -> float | None:
    return round(w.seen[key] - w.t_fault, 3) if key in w.seen else None


def _chart(phases: list[dict[str, Any]], steps: list[tuple[float, int, str]], path: Path, w: Watch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, height_ratios=[3, 2])
    seen = [p for p in phases if p["t_plus_s"] is not None]
    for i, p in enumerate(seen):
        ax1.barh(i, max(p["t_plus_s"], 0.05), left=0, color="#4a90d9", alpha=0.35)
        ax1.plot(p["t_plus_s"], i, "o", color="#1f4e79")
        ax1.text(p["t_plus_s"] + 0.3, i, f"{p['label']}  (t+{p['t_plus_s']:.1f}s)", va="center", fontsize=8)
    ax1.set_yticks([])
    ax1.invert_yaxis()
    ax1.set_title(f"autoheal lab: XID {DEMO_XID} on {w.node}, job {w.job} resumes by itself")
    runs: list[list[tuple[float, int]]] = []
    for t, step, kind in steps:
        if kind == "start" or not runs:
            runs.append([])
        runs[-1].append((t, step))
    for i, seg in enumerate(r for r in runs if r):
        xs, ys = zip(*seg, strict=True)
        ax2.plot(
            xs,
            ys,
            ".-",
            color="#2e7d32" if i == 0 else "#1565c0",
            markersize=3,
            label="before the fault" if i == 0 else f"after requeue (run {i + 1})",
        )
    ax2.axvline(0, color="#c62828", linestyle="--", label="fault")
    ax2.axhline(w.pre_fault_step, color="#999999", linestyle=":", label="pre-fault step")
    ax2.set_xlabel("seconds since the fault")
    ax2.set_ylabel("training step")
    ax2.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
