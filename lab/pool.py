"""The lab's node-pool controller: it plays the cloud's autoscaling group.

Pools are declared (size + spares), nodes are not. When the runbook retires a bad node, the pool is
one instance short; after a provisioning delay the controller brings a new one: a KWOK node with the
spare label and taint, a slurmd for a FUTURE Slurm node drained as a hot spare, and its simulated
GPUs. Because Pulumi only declares the pool, `pulumi preview` shows no change after any number of
replacements, and nothing ever resurrects a retired node (names are never reused).

Runs as one process per lab (`python -m lab.pool`) with a small JSON API on loopback (lab.poolapi
is its client): GET /v1/pools, POST /v1/retire {"node": ...}, POST /v1/ladder/<health|reset|
reboot|faults> {"nodes": [...], <options>} (lab.ladder.batch). In a pods lab it also listens on the
lab bridge for the runner's pod, where every call needs the runner's ServiceAccount token (checked
with a TokenReview). State lives in <run_dir>/pool/state.json.

In a pods lab (slurm: pods) every node is a real one, and slurmd is the SlurmCluster DaemonSet's
pod: a new node joins Slurm when its slurmd pod registers (drained as a spare), a retired one
leaves when that pod stops (lab.nodepods), and nothing here talks to Slurm.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx

from autoheal.errors import LabError
from autoheal.labels import (
    GPU_COUNT_LABEL,
    GPU_MODEL_LABEL,
    GPU_PRODUCT_LABEL,
    JOINING_REASON,
    POOL_LABEL,
    SPARE_LABEL,
    SPARE_REASON,
    gpu_taint,
    spare_taint,
)
from autoheal.names import is_node_name
from lab import aws, procs, slurm, watch
from lab.config import LabConfig, PoolConfig, load_lab
from lab.httpd import LabHTTPServer


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
        # an aws pool's nodes and their instances ({node: providerID}); lab.aws seeded the first
        if "instances" not in self.state:
            seeded = aws.instances_file(cfg)
            self.state["instances"] = json.loads(seeded.read_text()) if seeded.exists() else {}
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
                    "backend": p.backend,
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

    def retire(self, node: str, terminated: bool = False) -> dict[str, Any]:
        """Terminate an instance: its slurmd stops, its Kubernetes node and GPUs disappear. The
        Slurm node keeps the state and reason the runbook gave it, for the record. An aws pool's
        node leaves only when its instance was `terminated` (lab.aws's bridge saw it)."""
        with self.lock:
            if node in self.state["retired"]:
                return {"node": node, "changed": False, "state": "retired"}
            pool = self.pool_of(node)
            if pool is None or node not in self.state["members"][pool.name]:
                raise LabError(f"node: {node!r} is not a member of any pool of this lab")
            if pool.backend == "aws" and not terminated:
                raise LabError(
                    f"node: {node} is in pool {pool.name}, whose backend is aws: retire it through the"
                    f" AWS API (autoheal pool retire --backend aws --nodes {node})"
                )
            self.state["instances"].pop(node, None)
            real = self._is_real(node)
            self.state["members"][pool.name].remove(node)
            self.state["retired"].append(node)
            if real:  # the pool's next replacement is a real node again
                owed = self.state.setdefault("real_owed", {})
                owed[pool.name] = owed.get(pool.name, 0) + 1
            self._event("retired", node, pool.name, real=real)
            self._save()
        if self.cfg.pods:
            # a cloud's instance shuts down gracefully: its pods get their grace period, and the
            # slurmd pod takes its node out of Slurm on the way (components/slurm/workers.py)
            from lab import nodepods

            nodepods.shut_down(self.cfg, node)
        else:
            procs.stop(self.cfg.run_dir, slurm.slurmd_name(node))
        watch.stop(self.cfg, node)
        if real:
            from lab.nodes import cluster

            cluster.remove(self.cfg.run_dir, node)  # kubelet, containerd and its pods stop
        if self.cfg.kubeconfig.exists():
            from lab import controlplane

            controlplane.delete_node(self.cfg.kubeconfig, node)
        # the simulator gets the whole fleet in one PUT: a storm's retirements share one, next loop
        self._sim_dirty.set()
        return {"node": node, "changed": True, "state": "retired"}

    def ladder(self, what: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """A recovery-ladder operation for a batch (lab.ladder.batch): health, reset, reboot or
        faults of the named nodes, with the operation's options from the body."""
        from lab import ladder

        nodes = body.get("nodes")
        if not isinstance(nodes, list) or not nodes or not all(is_node_name(n) for n in nodes):
            raise LabError("nodes: a non-empty list of valid node names is required")
        allowed = {"health": {"peek"}, "reset": {"gpu", "timeout"}, "reboot": {"timeout"}}
        allowed["faults"] = {"health_failures", "reset", "reboot"}
        if what not in allowed:
            raise LabError(f"operation: {what!r} is not one of {', '.join(allowed)}")
        extra = sorted(set(body) - {"nodes"} - allowed[what])
        if extra:
            raise LabError(f"{what}: unknown option(s) {', '.join(extra)}")
        kw = {k: v for k, v in body.items() if k != "nodes"}
        return ladder.batch(self.cfg, what, [str(n) for n in nodes], **kw)

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
                if p.backend == "aws":  # its Auto Scaling group launches; the bridge queues them
                    continue
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
        if self.cfg.pods:
            self._provision_real(node, pool)
        else:
            self._provision_host(node, pool, bool(item.get("real")), item.get("provider_id", ""))
        with self.lock:
            self.state["pending"] = [x for x in self.state["pending"] if x["node"] != node]
            self.state["members"][pool.name].append(node)
            self._save()
        self._sync_simulator()
        with self.lock:
            self._event("replacement_ready", node, pool.name)
            self._save()

    def _provision_real(self, node: str, pool: PoolConfig) -> None:
        """A pods lab's new instance: a real node with the spare label and taint; the slurmd
        DaemonSet's pod on it registers the node in Slurm, drained as a hot spare."""
        from lab import nodepods
        from lab.nodes import cluster

        self._sync_simulator()  # its GPUs (and kernel log) exist before its pods ask for them
        cluster.add(self.cfg.run_dir, node, node_labels(pool, True), node_taints(True), pool.gpus_per_node)
        nodepods.wait_slurmd_ready(self.cfg, [node], timeout=180)

    def _provision_host(self, node: str, pool: PoolConfig, real: bool, provider_id: str = "") -> None:
        """A new node with a host slurmd. The pool controller's own come up as spares; an
        instance a cloud launched (`provider_id`) joins with the pool's labels only, drained
        "joining" until the runner's spare keeper makes it a spare or an active node."""
        spare = not provider_id
        reason = SPARE_REASON if spare else JOINING_REASON
        drain = ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"]
        # drained before its slurmd registers, so no job can land on it in between
        slurm.run(self.cfg, drain)
        procs.stop(self.cfg.run_dir, slurm.slurmd_name(node))  # a try that failed half-way left one
        slurm.start_slurmd(self.cfg, [node])
        watch.start(self.cfg, [node])  # reads the kernel log the simulator creates at the sync below
        if real:
            from lab.nodes import cluster

            # a fresh real node: its own namespaces, containerd, kubelet; Ready with its GPUs
            cluster.add(
                self.cfg.run_dir, node, node_labels(pool, True), node_taints(True), pool.gpus_per_node
            )
        elif self.cfg.kubeconfig.exists():
            from lab import controlplane

            spec = controlplane.KubeNodeSpec(
                node,
                node_labels(pool, spare),
                node_taints(spare),
                pool.gpus_per_node,
                provider_id=provider_id,
            )
            controlplane.add_nodes(self.cfg.kubeconfig, [spec], timeout=60)
        slurm.wait_nodes_registered(self.cfg, [node], timeout=30)
        slurm.run(self.cfg, drain)  # the reason does not survive registration of a FUTURE node

    def _sync_simulator(self) -> None:
        models = {}
        for p in self.cfg.pools:
            for n in self.state["members"][p.name]:
                models[n] = p.gpu_model
        # the simulator is optional for the controller; its metrics catch up on the next sync
        with contextlib.suppress(httpx.HTTPError):
            httpx.put(self.cfg.url("simulator", "/v1/nodes"), json={"nodes": models}, timeout=5)

    # -- an aws pool: what lab.aws's bridge and endpoint report --------------------------------

    def aws_nodes(self, pool: str) -> dict[str, str]:
        """{node: providerID} of the pool's nodes, members and pending."""
        with self.lock:
            return {
                n: pid
                for n, pid in self.state["instances"].items()
                if (p := self.pool_of(n)) and p.name == pool
            }

    def instance_launched(self, pool_name: str, provider_id: str) -> None:
        """The group launched an instance: it becomes the pool's next node after the
        provisioning delay (its boot)."""
        pool = next(p for p in self.cfg.pools if p.name == pool_name)
        with self.lock:
            free = self._free_names(pool)
            if not free:
                if not any(e["event"] == "headroom_exhausted" for e in self.state["events"][-5:]):
                    self._event("headroom_exhausted", "", pool.name, provider_id=provider_id)
                    self._save()
                return
            item = {"pool": pool.name, "node": free[0], "ready_at": time.time() + self.delay}
            item["provider_id"] = provider_id
            self.state["pending"].append(item)
            self.state["instances"][free[0]] = provider_id
            self._event("instance_launched", free[0], pool.name, provider_id=provider_id)
            self._save()

    def instance_terminated(self, node: str) -> None:
        """The node's instance left its group: the node goes, as a retired one does."""
        with self.lock:
            provider_id = self.state["instances"].get(node, "")
            self._event(
                "instance_terminated", node, getattr(self.pool_of(node), "name", ""), provider_id=provider_id
            )
            pending = [x for x in self.state["pending"] if x["node"] == node]
            if pending:  # never booted: nothing of it exists yet
                self.state["pending"].remove(pending[0])
                self.state["instances"].pop(node, None)
                self.state["retired"].append(node)
                self._save()
                return
            self._save()
        self.retire(node, terminated=True)

    def instances_rebooted(self, instances: list[str]) -> None:
        """RebootInstances was accepted: the nodes of those instances reboot (lab.ladder) and
        their Nodes report a new boot id, as a kubelet does after a boot. In a thread: the API
        answered before the reboot, as AWS does."""
        with self.lock:
            members = {n for names in self.state["members"].values() for n in names}
            # an instance still booting (its node pending) has nothing to reboot yet
            by_instance = {
                aws.instance_of(pid): n for n, pid in self.state["instances"].items() if n in members
            }
        nodes = [by_instance[i] for i in instances if i in by_instance]
        if nodes:
            threading.Thread(target=self._reboot_nodes, args=(nodes,), daemon=True).start()

    def _reboot_nodes(self, nodes: list[str]) -> None:
        """Each node rebooted (lab.ladder), then a new boot id on its Node; each outcome an event."""
        from lab import controlplane, ladder

        done: dict[str, Any] = {}
        try:
            done = ladder.reboot_many(self.cfg, nodes)
            with controlplane.http_client(self.cfg.kubeconfig, pool=4, timeout=10) as http:
                for n, boot in aws.new_boot_ids(
                    [n for n in nodes if not isinstance(done[n], Exception)]
                ).items():
                    http.patch(
                        f"/api/v1/nodes/{n}/status",
                        json={"status": {"nodeInfo": {"bootID": boot}}},
                        headers={"Content-Type": "application/merge-patch+json"},
                    ).raise_for_status()
        except Exception as exc:  # a thread's failure is the nodes' event, not a lost traceback
            done = done | {n: exc for n in nodes if not isinstance(done.get(n), Exception)}
        with self.lock:
            for n in nodes:
                pool = getattr(self.pool_of(n), "name", "")
                if isinstance(done.get(n), Exception):
                    self._event("reboot_failed", n, pool, error=str(done[n])[:200])
                else:
                    self._event("rebooted", n, pool)
            self._save()

    def run_forever(self, interval: float = 0.5, bridge: aws.Bridge | None = None) -> None:
        while True:
            try:
                if self._sim_dirty.is_set():
                    self._sim_dirty.clear()
                    self._sync_simulator()
                if bridge is not None:
                    bridge.sync()
                self.reconcile()
            except Exception as exc:  # keep reconciling: a cloud controller never gives up
                with self.lock:
                    self._event("error", "", "", error=str(exc)[:300])
                    self._save()
            time.sleep(interval)


# the identity a pods lab's pool API trusts: the runner's ServiceAccount (components.runner)
RUNNER_SUBJECT = "system:serviceaccount:autoheal:autoheal-runner"
BODY_LIMIT = 64 * 1024  # a batch of a few hundred node names


class TokenReviewer:
    """Who a bearer token is, asked of the API server (TokenReview) with the lab's admin
    credentials, as a cloud's IAM trusts a pod's projected ServiceAccount token (IRSA); answers
    are kept for a minute so a storm's calls cost one review."""

    TTL = 60.0

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self._seen: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def user(self, token: str) -> str | None:
        import hashlib

        key = hashlib.sha256(token.encode()).hexdigest()
        with self._lock:
            hit = self._seen.get(key)
            if hit and time.monotonic() - hit[0] < self.TTL:
                return hit[1]
        from lab import controlplane

        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        with controlplane.http_client(self.kubeconfig, pool=1, timeout=10) as http:
            r = http.post("/apis/authentication.k8s.io/v1/tokenreviews", json=review)
        status = r.json().get("status", {}) if r.status_code == 201 else {}
        user = status.get("user", {}).get("username") if status.get("authenticated") else None
        with self._lock:
            self._seen[key] = (time.monotonic(), user)
        return user


def _handler(ctl: PoolController, reviewer: TokenReviewer | None = None) -> type[BaseHTTPRequestHandler]:
    """The pool API. With a `reviewer` (the listener on the lab bridge, which pods reach) every
    call needs the runner's ServiceAccount token; the loopback listener is the host's own."""

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

        def _allowed(self) -> bool:
            if reviewer is None:
                return True
            auth = self.headers.get("Authorization") or ""
            token = auth[7:].strip() if auth.startswith("Bearer ") else ""
            user = reviewer.user(token) if token else None
            if user != RUNNER_SUBJECT:
                self._reply(
                    401 if user is None else 403, {"error": "the runner's ServiceAccount token is required"}
                )
                return False
            return True

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._reply(200, {"ok": True})
            elif self.path == "/v1/pools":
                if self._allowed():
                    self._reply(200, ctl.status())
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self) -> None:
            if not (self.path == "/v1/retire" or self.path.startswith("/v1/ladder/")):
                self._reply(404, {"error": "not found"})
                return
            if not self._allowed():
                return
            try:
                size = int(self.headers.get("Content-Length") or 0)
                if size > BODY_LIMIT:
                    raise LabError(f"body: {size} bytes is more than {BODY_LIMIT}")
                body = json.loads(self.rfile.read(size) or b"{}")
                if not isinstance(body, dict):
                    raise LabError("body: a JSON object is required")
                if self.path == "/v1/retire":
                    node = body.get("node")
                    if not is_node_name(node):
                        raise LabError("node: a valid node name is required")
                    self._reply(200, ctl.retire(str(node)))
                    return
                self._reply(200, ctl.ladder(self.path.rsplit("/", 1)[1], body))
            except (LabError, ValueError) as exc:
                self._reply(400, {"error": str(exc)})
            except Exception as exc:  # a bug answers with its cause, never a dropped connection
                self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})

    return Handler


PROC_NAME = "pool-controller"


def start(cfg: LabConfig) -> None:
    """Start the controller process of a lab and wait for its API."""
    import sys

    procs.start_service(
        PROC_NAME,
        [sys.executable, "-m", "lab.pool", f"--root={cfg.root}", f"--name={cfg.name}"],
        cfg.run_dir,
        port=cfg.port("pool_controller"),
        ready=procs.http_ok(cfg.url("pool_controller", "/healthz")),
        timeout=20,
    )


def client_status(cfg: LabConfig) -> dict[str, Any]:
    from lab.poolapi import PoolApi

    return PoolApi.of_lab(cfg).status()


def client_retire(cfg: LabConfig, node: str) -> dict[str, Any]:
    from lab.poolapi import PoolApi

    return PoolApi.of_lab(cfg).retire(node)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="autoheal lab node-pool controller")
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--name", required=True)
    a = ap.parse_args(argv)
    cfg = load_lab(a.name, a.root)
    if cfg is None:
        raise SystemExit(f"lab {a.name!r} not found under {a.root}")
    ctl = PoolController(cfg, cfg.provision_delay)
    server = LabHTTPServer(("127.0.0.1", cfg.port("pool_controller")), _handler(ctl))
    if cfg.pods:  # the runner's pod calls from the lab bridge, with its ServiceAccount token
        from lab.nodes import cluster

        gateway = cluster.context(cfg.run_dir).net.gateway
        bridge = LabHTTPServer(
            (gateway, cfg.port("pool_controller")), _handler(ctl, TokenReviewer(cfg.kubeconfig))
        )
        threading.Thread(target=bridge.serve_forever, daemon=True).start()
    aws_bridge = None
    if aws.enabled(cfg):  # the endpoint is bound before /healthz answers: `start` waits for both
        aws.serve_proxy(cfg, ctl.instances_rebooted)
        aws_bridge = aws.Bridge(cfg, ctl.aws_nodes, ctl.instance_launched, ctl.instance_terminated)
    threading.Thread(target=ctl.run_forever, kwargs={"bridge": aws_bridge}, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
