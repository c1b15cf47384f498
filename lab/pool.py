"""The lab's node-pool controller: it plays the cloud's autoscaling group.

Pools are declared (size + spares), nodes are not. When the runbook retires a bad node, the pool is
one instance short; after a provisioning delay the controller brings a new one: a KWOK node with the
spare label and taint, a slurmd for a FUTURE Slurm node drained as a hot spare, and its simulated
GPUs. Because Pulumi only declares the pool, `pulumi preview` shows no change after any number of
replacements, and nothing ever resurrects a retired node (names are never reused).

Runs as one process per lab (`python -m lab.pool`) with a small JSON API on loopback:
GET /v1/pools, POST /v1/retire {"node": ...}. State lives in <run_dir>/pool/state.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from autoheal.errors import LabError
from autoheal.labels import (
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_PRODUCT_LABEL,
    POOL_LABEL,
    SPARE_LABEL,
    SPARE_REASON,
    gpu_taint,
    spare_taint,
)
from autoheal.names import is_node_name
from lab import procs, slurm, watch
from lab.config import LabConfig, PoolConfig, load_lab


def node_labels(pool: PoolConfig, spare: bool) -> dict[str, str]:
    labels = {
        POOL_LABEL: pool.name,
        GPU_MODEL_LABEL: pool.gpu_type,
        GPU_PRODUCT_LABEL: pool.gpu_model.replace(" ", "-"),
        GPU_COUNT_LABEL: str(pool.gpus_per_node),
    }
    if spare:
        labels[SPARE_LABEL] = "true"
    return labels


def node_taints(spare: bool) -> list[dict[str, str]]:
    return [gpu_taint(), spare_taint()] if spare else [gpu_taint()]


class PoolController:
    def __init__(self, cfg: LabConfig, delay: float) -> None:
        self.cfg = cfg
        self.delay = delay
        self.dir = cfg.run_dir / "pool"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = self.dir / "state.json"
        self.lock = threading.RLock()
        self._sim_dirty = threading.Event()
        if self.file.exists():
            self.state: dict[str, Any] = json.loads(self.file.read_text())
        else:
            self.state = {
                "members": {p.name: p.slurm().active_nodes() + p.slurm().spare_nodes() for p in cfg.pools},
                "retired": [],
                "pending": [],
                "events": [],
            }
            self._save()

    # -- state -------------------------------------------------------------------------------

    def _save(self) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.file)

    def _event(self, kind: str, node: str, pool: str, **extra: Any) -> None:
        ev = {"ts": time.time(), "event": kind, "node": node, "pool": pool, **extra}
        self.state["events"].append(ev)
        with (self.dir / "events.jsonl").open("a") as f:
            f.write(json.dumps(ev) + "\n")

    def pool_of(self, node: str) -> PoolConfig | None:
        for p in self.cfg.pools:
            if node in p.slurm().node_names():
                return p
        return None

    def status(self) -> dict[str, Any]:
        with self.lock:
            pools = {}
            for p in self.cfg.pools:
                members = self.state["members"][p.name]
                pools[p.name] = {
                    "declared": p.size + p.spares,
                    "size": p.size,
                    "spares": p.spares,
                    "members": members,
                    "pending": [x["node"] for x in self.state["pending"] if x["pool"] == p.name],
                    "headroom_left": len(self._free_names(p)),
                }
            return {
                "pools": pools,
                "retired": self.state["retired"],
                "events": self.state["events"][-50:],
                "provision_delay_s": self.delay,
            }

    def _free_names(self, pool: PoolConfig) -> list[str]:
        used = set(self.state["members"][pool.name]) | set(self.state["retired"])
        used |= {x["node"] for x in self.state["pending"]}
        return [n for n in pool.slurm().future_nodes() if n not in used]

    # -- actions -----------------------------------------------------------------------------

    def retire(self, node: str) -> dict[str, Any]:
        """Terminate an instance: its slurmd stops, its Kubernetes node and GPUs disappear. The
        Slurm node keeps the state and reason the runbook gave it, for the record."""
        with self.lock:
            if node in self.state["retired"]:
                return {"node": node, "changed": False, "state": "retired"}
            pool = self.pool_of(node)
            if pool is None or node not in self.state["members"][pool.name]:
                raise LabError(f"node: {node!r} is not a member of any pool of this lab")
            real = self._is_real(node)
            self.state["members"][pool.name].remove(node)
            self.state["retired"].append(node)
            if real:  # the pool's next replacement is a real node again
                owed = self.state.setdefault("real_owed", {})
                owed[pool.name] = owed.get(pool.name, 0) + 1
            self._event("retired", node, pool.name, real=real)
            self._save()
        procs.stop(self.cfg.run_dir, slurm.slurmd_name(node))
        watch.stop(self.cfg, node)
        if real:
            from lab.nodes import cluster

            cluster.remove(self.cfg.run_dir, node)  # kubelet, containerd and its pods stop
        if self.cfg.kubeconfig.exists():
            from lab import kube

            kube.delete_node(self.cfg.kubeconfig, node)
        # the simulator gets the whole fleet in one PUT: a storm's retirements share one, next loop
        self._sim_dirty.set()
        return {"node": node, "changed": True, "state": "retired"}

    def _is_real(self, node: str) -> bool:
        if not self.cfg.real_nodes:
            return False
        from lab.nodes import cluster

        return node in cluster.names(self.cfg.run_dir)

    def reconcile(self) -> None:
        now = time.time()
        due: list[dict[str, Any]] = []
        with self.lock:
            for p in self.cfg.pools:
                have = len(self.state["members"][p.name])
                have += sum(1 for x in self.state["pending"] if x["pool"] == p.name)
                for _ in range(p.size + p.spares - have):
                    free = self._free_names(p)
                    if not free:
                        self._event("headroom_exhausted", "", p.name)
                        break
                    item = {"pool": p.name, "node": free[0], "ready_at": now + self.delay}
                    owed = self.state.setdefault("real_owed", {})
                    if owed.get(p.name, 0) > 0:
                        owed[p.name] -= 1
                        item["real"] = True
                    self.state["pending"].append(item)
                    self._event("provisioning", free[0], p.name, ready_at=item["ready_at"])
            due = [x for x in self.state["pending"] if x["ready_at"] <= now]
            self._save()
        for item in due:
            self._provision(item)

    def _provision(self, item: dict[str, Any]) -> None:
        node, pool = item["node"], self.pool_of(item["node"])
        if pool is None:  # reconcile() only queues names from a pool's headroom
            raise LabError(f"pool-controller: pending node {node!r} belongs to no pool of this lab")
        drain = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={SPARE_REASON}"]
        # drained before its slurmd registers, so no job can land on it in between
        slurm.run(self.cfg, drain)
        slurm.start_slurmd(self.cfg, [node])
        watch.start(self.cfg, [node])  # reads the kernel log the simulator creates at the sync below
        if item.get("real"):
            from lab.nodes import cluster

            # a fresh real node: its own namespaces, containerd, kubelet; Ready with its GPUs
            cluster.add(
                self.cfg.run_dir, node, node_labels(pool, True), node_taints(True), pool.gpus_per_node
            )
        elif self.cfg.kubeconfig.exists():
            from lab import kube

            spec = kube.KubeNodeSpec(node, node_labels(pool, True), node_taints(True), pool.gpus_per_node)
            kube.add_nodes(self.cfg.kubeconfig, [spec], timeout=60)
        slurm.wait_nodes_registered(self.cfg, [node], timeout=30)
        slurm.run(self.cfg, drain)  # the reason does not survive registration of a FUTURE node
        with self.lock:
            self.state["pending"] = [x for x in self.state["pending"] if x["node"] != node]
            self.state["members"][pool.name].append(node)
            self._save()
        self._sync_simulator()
        with self.lock:
            self._event("replacement_ready", node, pool.name)
            self._save()

    def _sync_simulator(self) -> None:
        models = {}
        for p in self.cfg.pools:
            for n in self.state["members"][p.name]:
                models[n] = p.gpu_model
        # the simulator is optional for the controller; its metrics catch up on the next sync
        with contextlib.suppress(httpx.HTTPError):
            httpx.put(self.cfg.url("simulator", "/v1/nodes"), json={"nodes": models}, timeout=5)

    def run_forever(self, interval: float = 0.5) -> None:
        while True:
            try:
                if self._sim_dirty.is_set():
                    self._sim_dirty.clear()
                    self._sync_simulator()
                self.reconcile()
            except Exception as exc:  # keep reconciling: a cloud controller never gives up
                with self.lock:
                    self._event("error", "", "", error=str(exc)[:300])
                    self._save()
            time.sleep(interval)


def _handler(ctl: PoolController) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path in ("/v1/pools", "/healthz"):
                self._reply(200, ctl.status())
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            if self.path != "/v1/retire":
                self._reply(404, {"error": "not found"})
                return
            try:
                body = json.loads(self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 4096)))
                node = body.get("node") if isinstance(body, dict) else None
                if not is_node_name(node):
                    raise LabError("node: a valid node name is required")
                self._reply(200, ctl.retire(str(node)))
            except (LabError, ValueError) as exc:
                self._reply(400, {"error": str(exc)})

    return Handler


def start(cfg: LabConfig) -> None:
    """Start the controller process of a lab and wait for its API."""
    import sys

    procs.start_service(
        "pool-controller",
        [sys.executable, "-m", "lab.pool", f"--root={cfg.root}", f"--name={cfg.name}"],
        cfg.run_dir,
        port=cfg.port("pool_controller"),
        ready=procs.http_ok(cfg.url("pool_controller", "/healthz")),
        timeout=20,
    )


def client_status(cfg: LabConfig) -> dict[str, Any]:
    r = httpx.get(cfg.url("pool_controller", "/v1/pools"), timeout=5)
    r.raise_for_status()
    data: dict[str, Any] = r.json()
    return data


def client_retire(cfg: LabConfig, node: str) -> dict[str, Any]:
    r = httpx.post(cfg.url("pool_controller", "/v1/retire"), json={"node": node}, timeout=60)
    data: dict[str, Any] = r.json()
    if r.status_code != 200:
        raise LabError(f"pool-controller: {data.get('error', r.text)}")
    return data


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="autoheal lab node-pool controller")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--name", required=True)
    a = ap.parse_args(argv)
    cfg = load_lab(a.name, a.root)
    if cfg is None:
        raise SystemExit(f"lab {a.name!r} not found under {a.root}")
    ctl = PoolController(cfg, cfg.provision_delay)
    server = ThreadingHTTPServer(("127.0.0.1", cfg.port("pool_controller")), _handler(ctl))
    server.daemon_threads = True
    threading.Thread(target=ctl.run_forever, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
