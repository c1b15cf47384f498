"""A GPU fleet simulator that speaks dcgm-exporter's metric names, with an XID injection API.

Prometheus scrapes it exactly as it would scrape dcgm-exporter on a real node (same metric names and
labels: gpu, UUID, device, modelName, Hostname), so the alert rules under test are the shipped ones.
`DCGM_FI_DEV_XID_ERRORS` is a gauge holding the last XID seen on a GPU (0 = none), as in dcgm.

Each node also has a kernel log and an nvidia-smi view (lab.kernlog) that the lab's XID watchers
read: an injected XID prints the driver's Xid line there too. With `vanish`, the GPU's series
disappear from /metrics instead, as when DCGM loses a GPU that fell off the bus: no XID sample is
ever scraped, only the kernel log and the lost-GPU rule can tell.

The recovery ladder acts on it as on a node's GPUs (docs/runbook.md, "The recovery ladder"): a GPU
reset clears the GPU's fault (not a GPU that fell off the bus: that takes a reboot), a reboot
clears the node's, and the health check is the lab's stand-in for DCGM diagnostics: a node is
healthy when no GPU holds an XID or is lost, throttles for heat or power, has a row remap pending
or a PCIe link below its maximum. Faults of the ladder itself can be injected: the
next N health checks fail, a reset or reboot fails or hangs.

API (JSON):  GET /healthz   GET /metrics   GET /v1/nodes   PUT /v1/nodes {"nodes": {name: model}}
             POST /v1/xid {"node", "gpu", "xid", "message"?, "vanish"?}   POST /v1/clear {"node", "gpu"?}
             POST /v1/kmsg {"node", "message"}  (a raw kernel message, e.g. garbage for tests)
             POST /v1/health {"node", "peek"?}  -> {"node", "healthy", "failures": [...], "gpus": [...]}
             POST /v1/reset {"node", "gpu"?}   POST /v1/reboot {"node"}
             POST /v1/faults {"node", "health_failures"?: n, "reset"?: "ok|fail|hang", "reboot"?: ...}
             POST /v1/link {"node", "flaps"?: n, "errors"?: m}  (the node's InfiniBand port lost its
                           link n times, saw m symbol errors: its sysfs link_downed and symbol_error
                           counters grow, as the watcher's link check reads)
             POST /v1/switch {"nodes", "flaps"?: n}  (the leaf switch of these nodes flapped: each
                           node's port lost its link n times at once)
             POST /v1/pcie {"node", "gpu", "width"}  (the GPU's PCIe link retrained at that width)
             POST /v1/gpu_state {"node", "gpu", "throttle_reasons"?: mask, "row_remap_pending"?: bool}
                           (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, DCGM_FI_DEV_ROW_REMAP_PENDING: what
                           the degraded-node rules read; a GPU reset applies a pending remap)
             POST /v1/step {"node", "slurm_job", "rank", "seconds"}  (a training job's rank reports
                           its step time: autoheal_train_step_seconds, as the straggler rule reads)
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from autoheal.faults import FaultClass, load_fault_catalog
from autoheal.names import is_node_name
from lab.httpd import LabHTTPServer
from lab.kernlog import KernelLogs, bus_id, fallen_message, gpu_uuid, xid_message
from watcher.links import read_pcie

LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
MAX_MESSAGE = 512
HANG_SECONDS = 3600.0  # an injected hang: longer than any step timeout of the ladder
ACTION_FAULTS = ("ok", "fail", "hang")


class LadderError(Exception):
    """A reset or reboot that failed (injected, or a GPU a reset cannot bring back)."""


class Fleet(Collector):
    """The simulated GPUs: nodes -> model, and injected XIDs per (node, gpu)."""

    def __init__(
        self, gpus_per_node: int, state_file: Path | None = None, kmsg_dir: Path | None = None
    ) -> None:
        self.gpus_per_node = gpus_per_node
        self.nodes: dict[str, str] = {}
        self.xids: dict[tuple[str, int], int] = {}
        self.lost: set[tuple[str, int]] = set()  # GPUs whose series vanished (DCGM lost them)
        # degraded GPUs (not kept across a simulator restart): clock throttle reasons, remap pending
        self.throttle: dict[tuple[str, int], int] = {}
        self.remap_pending: set[tuple[str, int]] = set()
        # training ranks' step times: (slurm job, rank) -> (node, seconds)
        self.steps: dict[tuple[str, int], tuple[str, float]] = {}
        # injected faults of the ladder itself, per node: health checks left to fail, and how the
        # next resets / reboots behave ("fail", "hang"); plus what the ladder did, for tests
        self.health_failures: dict[str, int] = {}
        self.action_faults: dict[tuple[str, str], str] = {}
        self.actions: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.state_file = state_file
        self.logs = KernelLogs(kmsg_dir, gpus_per_node) if kmsg_dir else None
        if state_file and state_file.exists():
            s = json.loads(state_file.read_text())
            self.nodes = dict(s["nodes"])
            self.xids = {(n, int(g)): int(x) for n, g, x in s["xids"]}
            self.lost = {(n, int(g)) for n, g in s.get("lost", [])}

    def _save(self) -> None:
        if self.state_file:
            xids = [[n, g, x] for (n, g), x in self.xids.items()]
            lost = [[n, g] for n, g in sorted(self.lost)]
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"nodes": self.nodes, "xids": xids, "lost": lost}))
            tmp.replace(self.state_file)

    def set_nodes(self, nodes: dict[str, str]) -> None:
        with self.lock:
            self.nodes = dict(nodes)
            self.xids = {k: v for k, v in self.xids.items() if k[0] in self.nodes}
            self.lost = {k for k in self.lost if k[0] in self.nodes}
            if self.logs is not None:
                for n, model in self.nodes.items():
                    self.logs.ensure(n, model)
            self._save()

    def inject(self, node: str, gpu: int, xid: int, message: str | None = None, vanish: bool = False) -> None:
        """Raise `xid` on a GPU: the gauge takes it (or, with `vanish`, the GPU's series disappear)
        and the node's kernel log gets the driver's line (plus the fallen-off-the-bus notice for 79)."""
        with self.lock:
            if vanish:
                self.lost.add((node, gpu))
            else:
                self.xids[(node, gpu)] = xid
            self._save()
        if self.logs is not None:
            lines = [xid_message(gpu, xid, message)] + ([fallen_message(gpu)] if xid == 79 else [])
            self.logs.write(node, lines)

    def flap_link(self, node: str, flaps: int) -> None:
        """The node's InfiniBand port lost its link `flaps` times (sysfs link_downed grows)."""
        if self.logs is not None and flaps:
            self.logs.sysfs(node).flap("mlx5_0", 1, flaps)

    def flap_switch(self, nodes: list[str], flaps: int) -> list[str]:
        """A leaf switch flapped: every node under it lost its link `flaps` times, at once."""
        for node in nodes:
            self.flap_link(node, flaps)
        return nodes

    def link_errors(self, node: str, errors: int) -> None:
        """The node's InfiniBand port saw `errors` more symbol errors (sysfs symbol_error grows)."""
        if self.logs is not None and errors:
            tree = self.logs.sysfs(node)
            tree.set_counter("mlx5_0", 1, "symbol_error", tree.counter("mlx5_0", 1, "symbol_error") + errors)

    def pcie_width(self, node: str, gpu: int, width: int) -> None:
        if self.logs is not None:
            self.logs.sysfs(node).set_link(f"{bus_id(gpu)}.0", width=width)

    def gpu_state(self, node: str, gpu: int, throttle: int | None, remap_pending: bool | None) -> None:
        with self.lock:
            if throttle is not None:
                self.throttle[(node, gpu)] = throttle
            if remap_pending is True:
                self.remap_pending.add((node, gpu))
            elif remap_pending is False:
                self.remap_pending.discard((node, gpu))

    def step(self, node: str, job: str, rank: int, seconds: float) -> None:
        with self.lock:
            self.steps[(job, rank)] = (node, seconds)

    def kmsg(self, node: str, message: str) -> None:
        """Append a raw message to a node's kernel log."""
        if self.logs is not None:
            self.logs.write(node, [message])

    def clear(self, node: str, gpu: int | None) -> None:
        with self.lock:
            self.xids = {k: v for k, v in self.xids.items() if not (k[0] == node and gpu in (None, k[1]))}
            self.lost = {k for k in self.lost if not (k[0] == node and gpu in (None, k[1]))}
            self.throttle = {
                k: v for k, v in self.throttle.items() if not (k[0] == node and gpu in (None, k[1]))
            }
            self.remap_pending = {k for k in self.remap_pending if not (k[0] == node and gpu in (None, k[1]))}
            self._save()

    def faults(self, node: str, health_failures: int | None, reset: str | None, reboot: str | None) -> None:
        """Inject faults of the ladder on `node` (None leaves a setting as it is)."""
        with self.lock:
            if health_failures is not None:
                self.health_failures[node] = health_failures
            for action, mode in (("reset", reset), ("reboot", reboot)):
                if mode is not None:
                    self.action_faults[(node, action)] = mode

    def health(self, node: str, peek: bool = False) -> dict[str, Any]:
        """The lab's DCGM diagnostics: every GPU present and without an XID, unless a failure is
        injected (it is consumed: the next check may pass). `peek` reads the GPUs without running
        a check (the evidence bundle): nothing is consumed or recorded."""
        with self.lock:
            failures = [f"GPU {g}: XID {x}" for (n, g), x in sorted(self.xids.items()) if n == node and x] + [
                f"GPU {g}: lost (not on the bus)" for n, g in sorted(self.lost) if n == node
            ]
            failures += self._degraded(node)
            if self.health_failures.get(node, 0) > 0 and not peek:
                self.health_failures[node] -= 1
                failures.append("injected diagnostic failure")
            if not peek:
                self.actions.append({"action": "health", "node": node, "ts": time.time(), "ok": not failures})
            gpus = [
                {
                    "gpu": g,
                    "uuid": gpu_uuid(node, g),
                    # a board serial as nvidia-smi prints it, derived from the UUID: stable per GPU
                    "serial": f"1652{int(gpu_uuid(node, g)[4:12], 16) % 10**9:09d}{g}",
                    "xid": self.xids.get((node, g), 0),
                }
                for g in range(self.gpus_per_node)
            ]
        return {"node": node, "healthy": not failures, "failures": failures, "gpus": gpus}

    def _degraded(self, node: str) -> list[str]:
        """What DCGM diagnostics fail on a degraded GPU (issue 36): clocks held down for heat or
        power (the catalogue's throttle reasons), a row remap pending (until a GPU reset applies
        it), a PCIe link below its maximum. A link flap or NIC errors are not the GPU's: they pass."""
        mask = load_fault_catalog().require(FaultClass.GPU_THROTTLE).throttle_mask
        out = []
        pcie = read_pcie(self.logs.sysfs(node).root) if self.logs is not None else {}
        for g in range(self.gpus_per_node):
            if reasons := self.throttle.get((node, g), 0) & mask:
                out.append(f"GPU {g}: clocks throttled (reasons 0x{reasons:x})")
            if (node, g) in self.remap_pending:
                out.append(f"GPU {g}: row remap pending")
            link = pcie.get(f"{bus_id(g)}.0")
            if link is not None and link.downtrained:
                out.append(f"GPU {g}: PCIe link {link.describe()}")
        return out

    def _act(self, node: str, action: str) -> None:
        mode = self.action_faults.get((node, action), "ok")
        if mode == "hang":
            time.sleep(HANG_SECONDS)  # the caller's step timeout must end this, not us
        if mode == "fail":
            raise LadderError(f"{action} of {node} failed (injected)")

    def reset(self, node: str, gpu: int | None) -> list[int]:
        """Reset a GPU (all of the node's when `gpu` is None): its XID clears. A GPU that fell off
        the bus does not come back from a reset; only a reboot brings it back."""
        gpus = list(range(self.gpus_per_node)) if gpu is None else [gpu]
        with self.lock:
            gone = [g for g in gpus if (node, g) in self.lost or self.xids.get((node, g)) == 79]
        if gone:
            raise LadderError(f"reset of {node}: GPU {gone[0]} is not on the bus (reboot needed)")
        self._act(node, "reset")
        with self.lock:
            self.xids = {k: v for k, v in self.xids.items() if not (k[0] == node and k[1] in gpus)}
            self.remap_pending = {k for k in self.remap_pending if not (k[0] == node and k[1] in gpus)}
            self.actions.append({"action": "reset", "node": node, "gpus": gpus, "ts": time.time()})
            self._save()
        return gpus

    def reboot(self, node: str) -> None:
        """Reboot a node: every GPU's fault clears and the driver announces the GPUs again."""
        self._act(node, "reboot")
        with self.lock:
            self.xids = {k: v for k, v in self.xids.items() if k[0] != node}
            self.lost = {k for k in self.lost if k[0] != node}
            self.remap_pending = {k for k in self.remap_pending if k[0] != node}
            self.throttle = {k: v for k, v in self.throttle.items() if k[0] != node}
            self.actions.append({"action": "reboot", "node": node, "ts": time.time()})
            self._save()
        if self.logs is not None:
            self.logs.write(node, ["Linux version 6.1.0 (simulated reboot)"], level=5)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self.lock:
            nodes = dict(self.nodes)
            xids = dict(self.xids)
            lost = set(self.lost)
            throttle = dict(self.throttle)
            remap = set(self.remap_pending)
            steps = dict(self.steps)
        step = GaugeMetricFamily(
            "autoheal_train_step_seconds",
            "A rank's last step time.",
            labels=["slurm_job", "rank", "Hostname"],
        )
        for (job, rank), (node, seconds) in sorted(steps.items()):
            step.add_metric([job, str(rank), node], seconds)
        yield step
        fams = {
            "xid": GaugeMetricFamily(
                "DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", labels=LABELS
            ),
            "util": GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=LABELS),
            "temp": GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=LABELS),
            "power": GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=LABELS),
            "fb": GaugeMetricFamily(
                "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=LABELS
            ),
            "throttle": GaugeMetricFamily(
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Throttling reasons bitmask.", labels=LABELS
            ),
            "remap": GaugeMetricFamily(
                "DCGM_FI_DEV_ROW_REMAP_PENDING", "Row remapping is pending.", labels=LABELS
            ),
        }
        for node, model in sorted(nodes.items()):
            for g in range(self.gpus_per_node):
                if (node, g) in lost:
                    continue  # DCGM lost this GPU: no series at all
                # the UUID follows the node's name: another node leaving changes no identity
                labels = [str(g), gpu_uuid(node, g), f"nvidia{g}", model, node]
                xid = xids.get((node, g), 0)
                fams["xid"].add_metric(labels, float(xid))
                # a GPU that fell off the bus reports nothing useful: zeros, as dcgm does
                healthy = xid == 0
                fams["util"].add_metric(labels, 87.0 if healthy else 0.0)
                fams["temp"].add_metric(labels, 61.0 + g if healthy else 0.0)
                fams["power"].add_metric(labels, 540.0 if healthy else 0.0)
                fams["fb"].add_metric(labels, 61440.0 if healthy else 0.0)
                fams["throttle"].add_metric(labels, float(throttle.get((node, g), 0)))
                fams["remap"].add_metric(labels, 1.0 if (node, g) in remap else 0.0)
        yield from fams.values()


def _handler(fleet: Fleet, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            if n > 1 << 20:
                raise ValueError("body too large")
            data = json.loads(self.rfile.read(n) or b"{}")
            if not isinstance(data, dict):
                raise ValueError("body must be a JSON object")
            return data

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(registry), "text/plain; version=0.0.4")
            elif self.path == "/healthz":
                self._reply(200, {"ok": True})
            elif self.path == "/v1/nodes":
                xids = [{"node": n, "gpu": g, "xid": x} for (n, g), x in sorted(fleet.xids.items())]
                self._reply(200, {"nodes": fleet.nodes, "xids": xids, "actions": fleet.actions[-200:]})
            else:
                self._reply(404, {"error": "not found"})

        def do_PUT(self) -> None:
            if self.path != "/v1/nodes":
                self._reply(404, {"error": "not found"})
                return
            try:
                nodes = self._body()["nodes"]
                if not isinstance(nodes, dict) or not all(map(is_node_name, nodes)):
                    raise ValueError("nodes: a map of valid node names to GPU models")
            except (ValueError, KeyError) as exc:
                self._reply(400, {"error": str(exc)})
                return
            fleet.set_nodes({str(k): str(v) for k, v in nodes.items()})
            self._reply(200, {"nodes": len(nodes)})

        def do_POST(self) -> None:
            try:
                body = self._body()
                if self.path == "/v1/switch":
                    self._reply(200, {"flapped": fleet.flap_switch(*_switch(body, fleet.nodes))})
                    return
                node = body.get("node")
                if not is_node_name(node) or node not in fleet.nodes:
                    raise ValueError(f"node: {node!r} is not a node of this fleet")
                gpu = body.get("gpu")
                if gpu is not None and not (isinstance(gpu, int) and 0 <= gpu < fleet.gpus_per_node):
                    raise ValueError(f"gpu: must be 0..{fleet.gpus_per_node - 1}")
                if self.path == "/v1/xid":
                    xid = body.get("xid")
                    if not (isinstance(xid, int) and 0 < xid < 1000) or gpu is None:
                        raise ValueError("xid: an integer 1..999 and a gpu are required")
                    message = body.get("message")
                    if message is not None and not (isinstance(message, str) and len(message) <= MAX_MESSAGE):
                        raise ValueError(f"message: a string of at most {MAX_MESSAGE} characters")
                    fleet.inject(str(node), gpu, xid, message, bool(body.get("vanish", False)))
                elif self.path == "/v1/kmsg":
                    message = body.get("message")
                    if not (isinstance(message, str) and len(message) <= MAX_MESSAGE):
                        raise ValueError(f"message: a string of at most {MAX_MESSAGE} characters")
                    fleet.kmsg(str(node), message)
                elif self.path == "/v1/link":
                    flaps, errors = body.get("flaps", 0 if "errors" in body else 1), body.get("errors", 0)
                    for name, n in (("flaps", flaps), ("errors", errors)):
                        if not (isinstance(n, int) and 0 <= n <= 100_000):
                            raise ValueError(f"{name}: an integer 0..100000")
                    fleet.flap_link(str(node), flaps)
                    fleet.link_errors(str(node), errors)
                elif self.path == "/v1/pcie":
                    width = body.get("width")
                    if gpu is None or not (isinstance(width, int) and width in (1, 2, 4, 8, 16)):
                        raise ValueError("pcie: a gpu and a width of 1, 2, 4, 8 or 16 are required")
                    fleet.pcie_width(str(node), gpu, width)
                elif self.path == "/v1/gpu_state":
                    mask, pending = body.get("throttle_reasons"), body.get("row_remap_pending")
                    if gpu is None or not (mask is None or (isinstance(mask, int) and 0 <= mask < 0x10000)):
                        raise ValueError("gpu_state: a gpu, and throttle_reasons a bitmask 0..0xffff")
                    if pending is not None and not isinstance(pending, bool):
                        raise ValueError("row_remap_pending: true or false")
                    fleet.gpu_state(str(node), gpu, mask, pending)
                elif self.path == "/v1/step":
                    job, rank, seconds = body.get("slurm_job"), body.get("rank"), body.get("seconds")
                    if not (isinstance(job, str) and job.isdigit() and len(job) <= 12):
                        raise ValueError("slurm_job: a job id (digits)")
                    if not (isinstance(rank, int) and 0 <= rank < 100_000):
                        raise ValueError("rank: an integer 0..99999")
                    if not (isinstance(seconds, int | float) and 0 < seconds < 86400):
                        raise ValueError("seconds: a step time in seconds")
                    fleet.step(str(node), job, rank, float(seconds))
                elif self.path == "/v1/clear":
                    fleet.clear(str(node), gpu)
                elif self.path in ("/v1/health", "/v1/reset", "/v1/reboot", "/v1/faults"):
                    self._ladder(str(node), gpu, body)
                    return
                else:
                    self._reply(404, {"error": "not found"})
                    return
            except ValueError as exc:
                self._reply(400, {"error": str(exc)})
                return
            self._reply(200, {"ok": True})

        def _ladder(self, node: str, gpu: int | None, body: dict[str, Any]) -> None:
            """The recovery ladder's endpoints: 200 with the outcome, 409 when the action failed."""
            try:
                if self.path == "/v1/health":
                    self._reply(200, fleet.health(node, peek=body.get("peek") is True))
                elif self.path == "/v1/reset":
                    self._reply(200, {"node": node, "reset": fleet.reset(node, gpu)})
                elif self.path == "/v1/reboot":
                    fleet.reboot(node)
                    self._reply(200, {"node": node, "rebooted": True})
                else:
                    fleet.faults(node, *_faults(body))
                    self._reply(200, {"ok": True})
            except LadderError as exc:
                self._reply(409, {"error": str(exc)})

    return Handler


def _switch(body: dict[str, Any], known: dict[str, str]) -> tuple[list[str], int]:
    """POST /v1/switch's body: the nodes under the switch and how often it flapped."""
    nodes, flaps = body.get("nodes"), body.get("flaps", 1)
    if not (isinstance(nodes, list) and nodes and all(is_node_name(n) and n in known for n in nodes)):
        raise ValueError(f"nodes: a list of nodes of this fleet is required, got {nodes!r}")
    if not (isinstance(flaps, int) and 0 < flaps <= 100_000):
        raise ValueError("flaps: an integer 1..100000")
    return [str(n) for n in nodes], flaps


def _faults(body: dict[str, Any]) -> tuple[int | None, str | None, str | None]:
    """The fields of POST /v1/faults, validated (ValueError names the field)."""
    n = body.get("health_failures")
    if n is not None and not (isinstance(n, int) and 0 <= n <= 1000):
        raise ValueError("health_failures: an integer 0..1000")
    modes: list[str | None] = []
    for key in ("reset", "reboot"):
        mode = body.get(key)
        if mode is not None and mode not in ACTION_FAULTS:
            raise ValueError(f"{key}: one of {', '.join(ACTION_FAULTS)}")
        modes.append(mode)
    return n, modes[0], modes[1]


def serve(
    port: int,
    gpus_per_node: int,
    nodes: dict[str, str],
    state_file: Path | None,
    kmsg_dir: Path | None = None,
) -> None:
    fleet = Fleet(gpus_per_node, state_file, kmsg_dir)
    fleet.set_nodes(fleet.nodes or nodes)
    registry = CollectorRegistry()
    registry.register(fleet)
    server = LabHTTPServer(("127.0.0.1", port), _handler(fleet, registry))
    server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="autoheal GPU fleet simulator (dcgm-exporter metrics)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--nodes", default="{}", help="JSON map of node name -> GPU model")
    ap.add_argument("--state", type=Path, default=None)
    ap.add_argument("--kmsg-dir", type=Path, default=None, help="per-node kernel logs for the XID watchers")
    a = ap.parse_args(argv)
    serve(a.port, a.gpus, json.loads(a.nodes), a.state, a.kmsg_dir)


if __name__ == "__main__":
    main()
