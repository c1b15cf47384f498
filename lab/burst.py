"""`autoheal lab demo --scenario burst`: an inference burst borrows a Slurm node and gives it back.

A pods lab (Slurm and the runner as the stack's pods on two real GPU nodes and a system node)
whose runner pod runs the lender (runner settings `lending`, here with the demo's short timers:
LENDING). The story, with nothing done by hand between its steps but the load:

1. training: a job (sbatch over ssh to the login pod) holds gpu-1's GPUs; gpu-2 is idle in Slurm;
2. the burst: the demo's load generator (a thread of this process) sends HTTP requests to the
   inference Service (a NodePort; each answer names the node and pod that served it) at a rate
   above what the Deployment serves: the demo's autoscaler (Autoscaler below, a simple
   requests-per-replica rule like an HPA on a request-rate metric, run in this process) scales the
   Deployment up; its pods (own PriorityClass, preemptionPolicy Never, nvidia.com/gpu each) are
   Pending, since every GPU node's GPUs belong to its slurmd pod;
3. the runner pod's lender lends the idle node: drained in Slurm with autoheal's reason, labelled
   lent, its slurmd pod leaves, the inference pods run there and the load generator sees its
   first answer from that node (the figure: burst -> first request served on the lent node);
   meanwhile a second training job queues in Slurm, waiting for a node;
4. the burst ends: the load drops to zero, the autoscaler scales the Deployment to 0, and after the
   lender's return_after and cooldown the node comes back: cordoned, its pods gone, label off,
   slurmd registers it again (the figure: burst over -> node back in Slurm) and the queued
   training job runs there.

The live view shows the timeline; the end prints the table of the phases (seconds after the burst
started) and writes report.json. bench/lending.py runs `burst()` N times on one lab.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from autoheal.errors import LabError
from autoheal.labels import LEND_LABEL, POOL_LABEL
from lab.config import LabConfig, PoolConfig

NAMESPACE = "default"
DEPLOYMENT = "infer"
SERVICE = "infer"
PRIORITY_CLASS = "inference"
SERVER_PORT = 8000
POD_GPUS = 2  # each inference replica asks for 2 of a node's 4 GPUs: one lent node serves 2
PER_POD_RPS = 10.0  # what one replica is declared to serve (the autoscaler's target)
BURST_RPS = 20.0  # the burst's offered load: 2 replicas, 4 GPUs: one whole node
# the runner pod's lender with the demo's timers (runner settings `lending`); the production
# defaults (config/runner.yaml: cooldown 300 s, return_after 120 s, grace 120 s) would make the
# demo last ten minutes for no more insight
LENDING: dict[str, Any] = {
    "priority_class": PRIORITY_CLASS,
    "max_nodes": 1,
    "max_percent": 50,
    "min_training": 1,
    "cooldown_seconds": 20,
    "return_after_seconds": 10,
    "grace_seconds": 15,
    "on_grace": "requeue",
    "interval_seconds": 1,
}

# A tiny inference server: answers every GET with the node and pod that served it (Downward API).
SERVER = f"""
import http.server, json, os
who = json.dumps({{"node": os.environ["NODE_NAME"], "pod": os.environ["POD_NAME"]}}).encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(who)))
        self.end_headers()
        self.wfile.write(who)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("", {SERVER_PORT}), H).serve_forever()
"""


def lab_config(name: str = "burst", port_base: int = 21000, root: Path | None = None) -> LabConfig:
    """The burst lab: 2 real GPU nodes of 4 GPUs (no spare), Slurm and the runner as pods, the
    runner pod's lender on with the demo's timers, a short Slurm grace."""
    kw: dict[str, Any] = {"root": root} if root else {}
    return LabConfig(
        name=name,
        port_base=port_base,
        pools=[PoolConfig(size=2, spares=0, headroom=1, gpus_per_node=4)],
        slurm="pods",
        grace_seconds=15,
        provision_delay=1.0,
        lending=dict(LENDING),
        **kw,
    )


# --- the inference service --------------------------------------------------------------------


def priority_class() -> dict[str, Any]:
    # never preempts: without preemptionPolicy Never the scheduler would evict a slurmd pod
    # (priority 0) under its running jobs to place an inference pod, lender or not
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": PRIORITY_CLASS},
        "value": 1000,
        "preemptionPolicy": "Never",
        "description": "inference: GPU pods the lender lends Slurm nodes to (lab demo --scenario burst)",
    }


def deployment(image: str, pool: str, gpus: int = POD_GPUS, replicas: int = 0) -> dict[str, Any]:
    labels = {"app": DEPLOYMENT}
    env = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "priorityClassName": PRIORITY_CLASS,
                    "nodeSelector": {POOL_LABEL: pool},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "serve",
                            "image": image,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-c", SERVER],
                            "env": env,
                            "ports": [{"containerPort": SERVER_PORT}],
                            "readinessProbe": {
                                "httpGet": {"path": "/", "port": SERVER_PORT},
                                "periodSeconds": 1,
                            },
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {
            "type": "NodePort",  # the host's way in: any real node's IP (Kubernetes picks the port)
            "selector": {"app": DEPLOYMENT},
            "ports": [{"port": 80, "targetPort": SERVER_PORT}],
        },
    }


class Kube:
    """The few API calls the scenario makes, on one connection."""

    def __init__(self, kubeconfig: Path) -> None:
        from lab import controlplane

        self.http = controlplane.http_client(kubeconfig, pool=2, timeout=15)

    def close(self) -> None:
        self.http.close()

    def _create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post(path, json=obj)
        if r.status_code == 409:  # there already (a second burst on the same lab)
            r = self.http.get(f"{path}/{obj['metadata']['name']}")
        if r.status_code not in (200, 201):
            raise LabError(
                f"burst: create {obj['kind']} {obj['metadata']['name']}: {r.status_code} {r.text[:300]}"
            )
        out: dict[str, Any] = r.json()
        return out

    def install(self, image: str, pool: str) -> int:
        """The PriorityClass, the Deployment (0 replicas) and its Service; returns the node port."""
        self._create("/apis/scheduling.k8s.io/v1/priorityclasses", priority_class())
        self._create(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment(image, pool))
        svc = self._create(f"/api/v1/namespaces/{NAMESPACE}/services", service())
        return int(svc["spec"]["ports"][0]["nodePort"])

    def scale(self, replicas: int) -> None:
        r = self.http.patch(
            f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{DEPLOYMENT}",
            content=json.dumps({"spec": {"replicas": replicas}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if r.status_code != 200:
            raise LabError(f"burst: scale {DEPLOYMENT} to {replicas}: {r.status_code} {r.text[:300]}")

    def pods(self) -> list[dict[str, Any]]:
        r = self.http.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": f"app={DEPLOYMENT}"}
        )
        r.raise_for_status()
        return [p for p in r.json()["items"] if not p["metadata"].get("deletionTimestamp")]

    def lender_events(self, node: str, namespace: str = "default") -> list[str]:
        """The reasons of the lender's Events on `node` (the runner writes them as its
        ServiceAccount, in its event namespace)."""
        r = self.http.get(
            f"/api/v1/namespaces/{namespace}/events", params={"fieldSelector": f"involvedObject.name={node}"}
        )
        r.raise_for_status()
        items = sorted(r.json()["items"], key=lambda e: e.get("firstTimestamp") or "")
        return [e["reason"] for e in items if (e.get("source") or {}).get("component") == "autoheal-lender"]

    def sides(self, pool: str) -> dict[str, str]:
        """node -> its side: the lend label's value, 'training' without one."""
        r = self.http.get("/api/v1/nodes", params={"labelSelector": f"{POOL_LABEL}={pool}"})
        r.raise_for_status()
        return {
            n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(LEND_LABEL, "training")
            for n in r.json()["items"]
        }


def node_url(run_dir: Path, node_port: int) -> str:
    """The Service's URL from this host: its NodePort on the first live real node (a pods lab's
    system node first: it is never lent or retired)."""
    from lab.nodes.apiproxy import node_port_targets

    targets = node_port_targets(run_dir, node_port)()
    if not targets:
        raise LabError("burst: the lab has no real node to reach the inference Service on")
    host, port = targets[0]
    return f"http://{host}:{port}/"


# --- the autoscaler and the load generator ---------------------------------------------------


@dataclass
class Autoscaler:
    """Replicas for an offered request rate: ceil(rps / per_pod_rps) within [min, max], up at
    once, down only once the lower count has held for `down_after` seconds (an HPA's scale-down
    stabilization: a dip in the load does not drop replicas it needs a second later)."""

    per_pod_rps: float
    max_replicas: int
    min_replicas: int = 0
    down_after: float = 5.0
    replicas: int = 0
    _low_since: float | None = None

    def __post_init__(self) -> None:
        if not self.per_pod_rps > 0:
            raise ValueError(f"per_pod_rps: a replica must serve some requests, got {self.per_pod_rps}")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"min_replicas/max_replicas: need 0 <= min <= max, got {self.min_replicas},"
                f" {self.max_replicas}"
            )
        if self.down_after < 0:
            raise ValueError(f"down_after: seconds >= 0, got {self.down_after}")

    def desired(self, rps: float) -> int:
        want = math.ceil(max(rps, 0.0) / self.per_pod_rps - 1e-9)
        return min(max(want, self.min_replicas), self.max_replicas)

    def decide(self, now: float, rps: float) -> int | None:
        """The new replica count when it changes now, else None."""
        want = self.desired(rps)
        if want > self.replicas:
            self._low_since = None
            self.replicas = want
            return want
        if want == self.replicas:
            self._low_since = None
            return None
        if self._low_since is None:
            self._low_since = now
        if now - self._low_since < self.down_after:
            return None
        self._low_since = None
        self.replicas = want
        return want


@dataclass(frozen=True)
class Answer:
    ts: float  # when the request was sent (time.time())
    ok: bool
    node: str = ""
    pod: str = ""
    latency_s: float = 0.0
    error: str = ""


@dataclass
class LoadGenerator:
    """Sends GET requests to `url` at `rate` per second (changed at any time; 0: none), one at a
    time from its own thread, and keeps every answer."""

    url: str
    rate: float = 0.0
    timeout: float = 1.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> LoadGenerator:
        self._thread = threading.Thread(target=self._run, name="load-generator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 5)

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout) as client:
            next_at = time.monotonic()
            while not self._stop.is_set():
                rate = self.rate
                if rate <= 0:
                    self._stop.wait(0.1)
                    next_at = time.monotonic()
                    continue
                self._stop.wait(max(0.0, next_at - time.monotonic()))
                next_at = max(next_at + 1.0 / rate, time.monotonic() - 1.0)  # no catch-up storm
                self._one(client)

    def _one(self, client: httpx.Client) -> None:
        ts, t0 = time.time(), time.monotonic()
        try:
            r = client.get(self.url)
            r.raise_for_status()
            who = r.json()
            a = Answer(ts, True, str(who.get("node", "")), str(who.get("pod", "")), time.monotonic() - t0)
        except (httpx.HTTPError, ValueError) as exc:
            a = Answer(ts, False, latency_s=time.monotonic() - t0, error=type(exc).__name__)
        with self._lock:
            self.answers.append(a)

    def since(self, t: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.ts >= t]


def first_served(answers: list[Answer], node: str, since: float) -> Answer | None:
    """The first request after `since` that a pod on `node` answered."""
    return next((a for a in answers if a.ok and a.node == node and a.ts >= since), None)


# --- Slurm, through the login pod ------------------------------------------------------------

SCHEDULABLE = ("idle", "alloc", "mix", "comp")


def slurm_states(run: Callable[[list[str]], str]) -> dict[str, str]:
    """node -> its sinfo state, without the flag suffixes (idle*, mix~, drain$ ...)."""
    out: dict[str, str] = {}
    for line in run(["sinfo", "-h", "-N", "-o", "%N %t"]).splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = re.sub(r"[^a-z]+$", "", parts[1])
    return out


def job_where(run: Callable[[list[str]], str], job: str) -> tuple[str, str]:
    """(state, nodes) of a job; ('', '') once Slurm forgot it."""
    out = run(["squeue", "-h", "-j", job, "-o", "%T %N"]).strip()
    state, _, nodes = out.partition(" ")
    return state, nodes.strip()


# --- one burst ---------------------------------------------------------------------------------

# (key, label): the phases of one burst, in order
PHASES: list[tuple[str, str]] = [
    ("burst", "load rises above capacity (burst)"),
    ("scaled_up", "Deployment scaled up (autoscaler)"),
    ("pending", "inference pods Pending (no free GPU)"),
    ("lending", "node lending (Slurm drain, lender)"),
    ("lent", "node lent (slurmd leaves, lender)"),
    ("queued", "training job queued for a node"),
    ("pod_running", "inference pod Running on the lent node"),
    ("first_served", "first request served on the lent node"),
    ("burst_over", "load drops (burst over)"),
    ("scaled_down", "Deployment scaled to 0 (autoscaler)"),
    ("returning", "node returning (cordon, evict, lender)"),
    ("returned", "node returned (label off, lender)"),
    ("in_slurm", "node back in Slurm (slurmd registered)"),
    ("training", "training job running on the node"),
]
JOURNAL_PHASES = {"lend": "lending", "lent": "lent", "return": "returning", "returned": "returned"}


@dataclass
class Burst:
    """The state of one burst as watched from outside: what the demo and the bench read."""

    pool: str
    t0: float = 0.0
    seen: dict[str, float] = field(default_factory=dict)
    node: str = ""  # the lent node
    sides: dict[str, str] = field(default_factory=dict)
    replicas: int = 0
    ready: int = 0
    rate: float = 0.0
    queued_job: str = ""
    journal: list[dict[str, Any]] = field(default_factory=list)

    def mark(self, key: str, ts: float | None = None) -> None:
        self.seen.setdefault(key, time.time() if ts is None else ts)

    def rows(self) -> list[tuple[str, str, float | None]]:
        return [(key, label, self.seen.get(key)) for key, label in PHASES]

    def figures(self) -> dict[str, float | None]:
        def d(a: str, b: str) -> float | None:
            return round(self.seen[b] - self.seen[a], 3) if a in self.seen and b in self.seen else None

        return {
            "burst_to_first_served_s": d("burst", "first_served"),
            "burst_to_lent_s": d("burst", "lent"),
            "burst_over_to_in_slurm_s": d("burst_over", "in_slurm"),
            "burst_over_to_training_s": d("burst_over", "training"),
        }

    def table(self, title: str) -> Table:
        t = Table(title=title)
        t.add_column("phase")
        t.add_column("t+ (s)", justify="right")
        t.add_column("delta (s)", justify="right")
        prev = self.t0
        for key, label, ts in self.rows():
            if key == "queued" and not self.queued_job:
                continue
            if key == "training" and not self.queued_job:
                continue
            if ts is None:
                t.add_row(label, "[dim]...[/dim]", "")
                continue
            t.add_row(label, f"{ts - self.t0:6.2f}", f"{max(0.0, ts - prev):6.2f}")
            prev = max(prev, ts)
        return t

    def status(self, load: LoadGenerator) -> Text:
        answers = load.since(self.t0)
        ok = sum(1 for a in answers if a.ok)
        sides = ", ".join(f"{n} {s}" for n, s in sorted(self.sides.items()))
        return Text(
            f"load {self.rate:4.1f} rps  replicas {self.replicas} (ready {self.ready})  requests"
            f" {len(answers)}: {ok} served, {len(answers) - ok} failed  |  {sides}"
            f"  |  t+{time.time() - self.t0:5.1f}s"
        )


@dataclass
class Scenario:
    """What one burst needs: the cluster, Slurm, the load and the autoscaler, the lender's journal."""

    kube: Kube
    slurm: Callable[[list[str]], str]
    load: LoadGenerator
    scaler: Autoscaler
    pool: str
    journal_path: Path | None = None  # the runner pod's lending.jsonl (its volume on this host)
    burst_rps: float = BURST_RPS
    hold_s: float = 5.0  # serving on the lent node this long before the burst ends

    def lender_rows(self, since: float) -> list[dict[str, Any]]:
        if self.journal_path is None or not self.journal_path.exists():
            return []
        rows = []
        for line in self.journal_path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line being written
            if float(row.get("ts", 0)) >= since - 1 and not row.get("dry_run"):
                rows.append(row)
        return rows

    def observe(self, b: Burst) -> None:
        b.sides = self.kube.sides(self.pool)
        pods = self.kube.pods()
        b.ready = sum(1 for p in pods if _ready(p))
        if "scaled_up" in b.seen and any(p["status"].get("phase") == "Pending" for p in pods):
            b.mark("pending")
        b.journal = self.lender_rows(b.t0)
        for row in b.journal:
            if row.get("action") == "lend" and not b.node:
                b.node = str(row["node"])
            phase = JOURNAL_PHASES.get(str(row.get("action")))
            if phase and row.get("node") == b.node:
                b.mark(phase, float(row["ts"]))
        if not b.node:  # no journal to read: the Node's label says it too (seen later)
            b.node = next((n for n, s in b.sides.items() if s != "training"), "")
            if b.node:
                b.mark("lending")
        if b.node and b.sides.get(b.node) == "lent":
            b.mark("lent")
        if b.node and any(p["spec"].get("nodeName") == b.node and _running(p) for p in pods):
            b.mark("pod_running")
        if b.node and "first_served" not in b.seen:
            a = first_served(self.load.since(b.t0), b.node, b.t0)
            if a is not None:
                b.mark("first_served", a.ts)
        if "returning" in b.seen or (b.node and b.sides.get(b.node) == "returning"):
            b.mark("returning")
            if b.sides.get(b.node) == "training":
                b.mark("returned")
            if slurm_states(self.slurm).get(b.node) in SCHEDULABLE:
                b.mark("in_slurm")
        if b.queued_job and "in_slurm" in b.seen:
            state, nodes = job_where(self.slurm, b.queued_job)
            if state == "RUNNING" and b.node in nodes.split(","):
                b.mark("training")

    def burst(
        self,
        timeout: float = 300,
        on_lent: Callable[[Burst], str] | None = None,
        tick: Callable[[Burst], None] = lambda b: None,
    ) -> Burst:
        """One burst, from the load rising to the lent node back in Slurm (and, when `on_lent`
        queued a training job, that job running there)."""
        b = Burst(self.pool, t0=time.time())
        deadline = time.monotonic() + timeout
        b.mark("burst", b.t0)
        b.rate = self.load.rate = self.burst_rps
        try:
            while time.monotonic() < deadline:
                now = time.time()
                over = "first_served" in b.seen and now - b.seen["first_served"] >= self.hold_s
                if over and "burst_over" not in b.seen:
                    b.rate = self.load.rate = 0.0
                    b.mark("burst_over", now)
                want = self.scaler.decide(now, self.load.rate)
                if want is not None:
                    self.kube.scale(want)
                    b.mark("scaled_up" if want > 0 else "scaled_down")
                b.replicas = self.scaler.replicas
                self.observe(b)
                if on_lent is not None and "lent" in b.seen and not b.queued_job:
                    b.queued_job = on_lent(b)
                    b.mark("queued")
                tick(b)
                if "in_slurm" in b.seen and (not b.queued_job or "training" in b.seen):
                    return b
                time.sleep(0.25)
        finally:
            self.load.rate = 0.0
        missing = [
            label
            for key, label, ts in b.rows()
            if ts is None and (b.queued_job or key not in ("queued", "training"))
        ]
        raise LabError(
            f"burst: not over after {timeout:.0f}s; waiting for: {missing[0] if missing else '?'}"
            f" (node {b.node or 'none lent'}, sides {b.sides}); the lender runs in the runner pod:"
            " `autoheal lab status` and its log say why"
        )


def _ready(pod: dict[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


# --- the lab around it -------------------------------------------------------------------------


def lender_journal(cfg: LabConfig) -> Path | None:
    """The runner pod's lending.jsonl as this host sees it (its state_dir on the journal volume)."""
    from lab import runner

    sqlite = runner.pod_journal_path(cfg)
    return None if sqlite is None else sqlite.parent / "state" / "lending.jsonl"


@dataclass
class Setup:
    scenario: Scenario
    side: Any  # lab.demo.PodSlurm
    url: str
    training_job: str = ""
    progress: Path | None = None  # the example job's progress file

    def close(self) -> None:
        self.scenario.load.stop()
        self.scenario.kube.close()
        self.side.close()


def prepare(cfg: LabConfig, rdir: Path, training: str = "pytorch") -> Setup:
    """On a running burst lab: the inference service installed (0 replicas), the load generator
    started (idle), a training job holding gpu-1. `training`: "pytorch" (the example job,
    examples/train.sbatch on one node) or "sleep" (a job that only holds the node: the bench)."""
    from lab import demo, stack

    if not cfg.lending:
        raise LabError(
            "burst: the lab's runner has no lender (lending settings); bring it up with lab.burst.lab_config"
        )
    pool = cfg.pools[0]
    image = stack.built_images(cfg).get("runner")
    if image is None:
        raise LabError("burst: no runner image built for this lab (the inference server runs its python3)")
    kube = Kube(cfg.kubeconfig)
    side = demo.PodSlurm(cfg)
    port = kube.install(image, pool.name)
    url = node_url(cfg.run_dir, port)
    load = LoadGenerator(url).start()
    scaler = Autoscaler(PER_POD_RPS, max_replicas=max(1, pool.gpus_per_node // POD_GPUS), down_after=3.0)
    scenario = Scenario(kube, side.run, load, scaler, pool.name, lender_journal(cfg))
    s = Setup(scenario, side, url)
    first = f"{pool.prefix}-1"
    s.training_job, s.progress = submit_training(side, training, pool, rdir, node=first)
    _wait(lambda: job_where(side.run, s.training_job) == ("RUNNING", first), 120, f"training job on {first}")
    return s


def submit_training(
    side: Any, kind: str, pool: PoolConfig, rdir: Path, node: str | None = None
) -> tuple[str, Path | None]:
    """A one-node training job holding all of a node's GPUs; (job id, its progress file on this
    host, for the example job)."""
    argv = ["sbatch", "--parsable", "-N", "1", f"--gres=gpu:{pool.gpus_per_node}"]
    argv += ["-w", node] if node else []
    if kind == "sleep":
        return side.run([*argv, "-J", "train", "-o", "/dev/null", "--wrap", "sleep 3600"]).strip(), None
    if kind != "pytorch":
        raise LabError(f"burst: training must be 'pytorch' or 'sleep', got {kind!r}")
    from lab.stack import job_environment

    host, _ = side.outputs(rdir)  # a fresh folder of the shared /checkpoints volume
    env = {**job_environment(), "CKPT_DIR": side.ckpt_path, "AUTOHEAL_EXAMPLES": side.home}
    env["TRAIN_ARGS"] = "--step-time 0.5 --ckpt-every 20"  # paced: the lab's two cores are shared
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    sbatch = shlex.join([*argv, "-o", f"{side.ckpt_path}/train.out", "train.sbatch"])
    job = side.login.run(f"cd {side.home} && {exports} {sbatch}").strip().split(";")[0]
    return job, host / "progress.jsonl"


def training_step(progress: Path | None) -> int:
    """The example job's last step (its progress file); 0 before its first."""
    if progress is None or not progress.exists():
        return 0
    steps = [0]
    for line in progress.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("event") in ("step", "first_step"):
            steps.append(int(e["step"]))
    return max(steps)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    from lab import procs

    procs.wait_until(check, timeout, f"burst: {what}", interval=0.5)


def wait_cooled(cfg: LabConfig, node: str) -> float:
    """Until `node` is out of the lender's cooldown (else a new burst takes the other, busy node);
    returns the seconds waited."""
    from autoheal.labels import LEND_MOVED_ANNOTATION
    from lab import controlplane

    with controlplane.http_client(cfg.kubeconfig, pool=1) as http:
        ann = http.get(f"/api/v1/nodes/{node}").json()["metadata"].get("annotations") or {}
    moved = float(ann.get(LEND_MOVED_ANNOTATION) or 0)
    wait = max(0.0, moved + float(cfg.lending.get("cooldown_seconds", 300)) + 1 - time.time())
    time.sleep(wait)
    return wait


# --- the demo ------------------------------------------------------------------------------------


def run_demo(
    cfg: LabConfig,
    keep: bool,
    console: Console,
    out: Console,
    report_dir: Path | None = None,
    timeout: float = 600,
) -> dict[str, Any]:
    from lab import demo

    with demo.demo_lab(cfg, keep, console, " (the runner pod's lender is on)") as cfg:
        report = trial(cfg, report_dir or cfg.run_dir / "demo", console, out, timeout)
        report["pulumi_up_s"] = demo._pods_stack_seconds(cfg)
        return report


def trial(
    cfg: LabConfig, rdir: Path, console: Console, out: Console, timeout: float, live: bool = True
) -> dict[str, Any]:
    """The burst story on a running burst lab: training, burst, lend, serve, return, training."""
    pool = cfg.pools[0]
    s = prepare(cfg, rdir, "pytorch")
    s.scenario.hold_s = 10.0  # serve on the lent node a while before the burst ends
    jobs = [s.training_job]
    try:
        console.print(
            f"training job {s.training_job} runs on {pool.prefix}-1 (examples/train.sbatch, 1 node x"
            f" {pool.gpus_per_node} GPUs); {pool.prefix}-2 is idle; inference: Deployment {DEPLOYMENT}"
            f" at 0 replicas behind {s.url}"
        )
        _wait(lambda: training_step(s.progress) > 0, 240, "the training job's first step")
        console.print(
            f"training at step {training_step(s.progress)}; burst: {BURST_RPS:.0f} requests/s against"
            f" {PER_POD_RPS:.0f} per replica ({POD_GPUS} GPUs each): the demo's autoscaler scales up,"
            " the runner pod's lender does the rest"
        )

        def queue(b: Burst) -> str:
            job, _ = submit_training(s.side, "pytorch", pool, rdir)
            jobs.append(job)
            return job

        extra = lambda: f"training job {s.training_job}: step {training_step(s.progress)}"  # noqa: E731
        b = (
            _run_live(s.scenario, timeout, queue, console, extra)
            if live
            else s.scenario.burst(timeout, queue)
        )
    finally:
        for job in jobs:
            s.side.run(["scancel", job])
        s.close()
    out.print(b.table(f"inference burst: {b.node} lent and back (t+ from the burst)"))
    events = Kube(cfg.kubeconfig)
    try:
        reasons = events.lender_events(b.node) if b.node else []
    finally:
        events.close()
    report = _report(b, s.scenario.load, rdir)
    report["training_jobs"] = jobs
    report["node_events"] = reasons  # written by the runner pod's lender, as its ServiceAccount
    out.print(f"Events on {b.node} from the runner pod's lender: {', '.join(reasons) or 'none'}")
    figs = report["figures"]
    out.print(
        f"burst -> first request served on the lent node: {_s(figs['burst_to_first_served_s'])};"
        f" burst over -> node back in Slurm: {_s(figs['burst_over_to_in_slurm_s'])}; queued training"
        f" job {b.queued_job} running there: {_s(figs['burst_over_to_training_s'])} after the burst ended"
    )
    out.print(f"report: {report['json']}")
    return report


def _s(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.1f} s"


def _run_live(
    sc: Scenario, timeout: float, queue: Callable[[Burst], str], console: Console, extra: Callable[[], str]
) -> Burst:
    with Live(console=console, refresh_per_second=4) as view:

        def tick(b: Burst) -> None:
            view.update(Group(b.table("inference burst (live)"), b.status(sc.load), Text(extra())))

        return sc.burst(timeout, queue, tick)


def _report(b: Burst, load: LoadGenerator, rdir: Path) -> dict[str, Any]:
    answers = load.since(b.t0)
    served = [a for a in answers if a.ok]
    data: dict[str, Any] = {
        "scenario": "burst",
        "lent_node": b.node,
        "queued_job": b.queued_job,
        "phases": [
            {
                "phase": k,
                "label": label,
                "ts": ts,
                "t_plus_s": round(ts - b.t0, 3) if ts is not None else None,
            }
            for k, label, ts in b.rows()
        ],
        "figures": b.figures(),
        "requests": {
            "sent": len(answers),
            "served": len(served),
            "served_on_lent_node": sum(1 for a in served if a.node == b.node),
            "failed": len(answers) - len(served),
            "p50_latency_ms": round(1000 * sorted(a.latency_s for a in served)[len(served) // 2], 2)
            if served
            else None,
        },
        "lender_journal": b.journal,
        "lending_settings": LENDING,
    }
    rdir.mkdir(parents=True, exist_ok=True)
    js = rdir / "report.json"
    js.write_text(json.dumps(data, indent=2))
    return {"json": str(js), **data}
