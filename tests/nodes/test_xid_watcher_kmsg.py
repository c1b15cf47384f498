"""The XID watcher, as `pulumi up` deploys it, reads the real /dev/kmsg on a real node: a Xid line
written to the kernel's ring buffer, as the NVIDIA driver prints it, becomes an alert with the
node's and the GPU's labels; a restarted watcher does not see it again; and the pod runs with
exactly the privileges docs/operations.md ("Privileges") establishes, no fewer working.

The lab's real nodes all run on this one kernel, so every watcher on every node would see the
line: the DaemonSet (rendered by components.xid_watcher under Pulumi mocks) is pinned to one node
here, and the alert must name that node. Two placement details differ from what `pulumi up`
sends, both outside the container's security context: that node selector, and the state's hostPath
(a folder of this test instead of the host's /var/lib/autoheal, which would outlive it). The bus id
is new on each run: the watcher's first start replays the last 300 s of the kernel log, where an
earlier run's line would otherwise answer for this one.
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoheal.monitoring import FATAL_ALERT, SOURCE_LABEL, SOURCE_WATCHER
from autoheal.xid import load_catalog
from components.xid_watcher import WATCHER_PORT, XidWatcherArgs, xid_watcher
from tests.components.harness import run_program
from tests.nodes.conftest import Cluster, unique
from tests.support import wait_for

pytestmark = pytest.mark.timeout(300)

# the one node the watcher DaemonSet runs on, and the pod with capabilities alone too (rn-2 may be
# NotReady by now: test_real_nodes.py's last test stops its kubelet)
NODE = "rn-1"
KMSG = Path("/dev/kmsg")
NS = "default"
# What the pod must run with, and nothing more (components.xid_watcher.kmsg_security_context)
LEAST = {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True}
# The narrowest set without `privileged`: what the DaemonSet had before, measured to fail
CAPS_ONLY = {
    "runAsUser": 0,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"], "add": ["SYSLOG"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _ints(value: Any) -> Any:
    """Pulumi's mocks give every number as a float (9402.0), which the API server refuses for
    an int32 field; the provider converts by its schema, this by value."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def rendered_daemonset(alertmanager_url: str, image: str) -> dict[str, Any]:
    """The DaemonSet components.xid_watcher declares for a real node (kernel_log_dir None)."""

    def program() -> None:
        import pulumi

        class Parent(pulumi.ComponentResource):
            def __init__(self) -> None:
                super().__init__("t:x:P", "p")

        xid_watcher(Parent(), "t", XidWatcherArgs(NS, alertmanager_url=alertmanager_url, image=image), {})

    ds: dict[str, Any] = _ints(run_program(program).one("kubernetes:apps/v1:DaemonSet", "xid-watcher").inputs)
    return ds


class AlertSink:
    """Alertmanager's POST /api/v2/alerts on the lab bridge's address, where pods reach the host."""

    def __init__(self, host: str) -> None:
        self.alerts: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = self.path == "/api/v2/alerts"
                self.send_response(200 if ok else 404)
                self.end_headers()
                if ok:
                    with sink.cond:
                        sink.alerts.extend(json.loads(body))
                        sink.cond.notify_all()

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def matching(self, bus: str) -> list[dict[str, Any]]:
        with self.cond:
            return [a for a in self.alerts if a["labels"].get("pci_bus_id") == bus]

    def wait(self, bus: str, timeout: float) -> list[dict[str, Any]]:
        with self.cond:
            self.cond.wait_for(
                lambda: any(a["labels"].get("pci_bus_id") == bus for a in self.alerts), timeout
            )
        return self.matching(bus)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def sink(real_cluster: Cluster) -> Iterator[AlertSink]:
    s = AlertSink(real_cluster.ctx.net.gateway)
    yield s
    s.close()


def _pods(c: Cluster, selector: str) -> list[dict[str, Any]]:
    r = c.http.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": selector})
    r.raise_for_status()
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def _running(c: Cluster, selector: str, exclude: str = "") -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        for p in _pods(c, selector):
            meta, status = p["metadata"], p["status"]
            mine = meta["uid"] != exclude and not meta.get("deletionTimestamp")
            if mine and status.get("phase") == "Running" and status.get("podIP"):
                return p
        return None

    pod: dict[str, Any] = wait_for(one, 90, f"a running pod ({selector})")
    return pod


def _health(pod: dict[str, Any]) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"http://{pod['status']['podIP']}:{WATCHER_PORT}/healthz", timeout=1)
    except httpx.HTTPError:
        return None
    out: dict[str, Any] = r.json()
    return out


def _metric(pod: dict[str, Any], name: str) -> float:
    text = httpx.get(f"http://{pod['status']['podIP']}:{WATCHER_PORT}/metrics", timeout=2).text
    lines = [line for line in text.splitlines() if line.split("{")[0].split(" ")[0] == name]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def _write_kmsg(*messages: str) -> None:
    """As the driver would print them (KERN_ERR); a userspace write becomes one record per write."""
    fd = os.open(KMSG, os.O_WRONLY)
    try:
        for m in messages:
            os.write(fd, f"<3>{m}\n".encode())
    finally:
        os.close(fd)


def test_a_xid_line_in_the_real_kernel_log_alerts_from_the_least_privileged_watcher(
    real_cluster: Cluster, sink: AlertSink, tmp_path: Path
) -> None:
    c = real_cluster
    ds = rendered_daemonset(sink.url, c.image("runner"))
    pod = ds["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    # the contract: exactly the least set, privileged because nothing less opens the device
    assert container["securityContext"] == LEAST
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["kmsg"]["hostPath"] == {"path": str(KMSG), "type": "CharDevice"}
    assert {m["name"]: m.get("readOnly") for m in container["volumeMounts"]}["kmsg"] is True
    assert not any(pod["spec"].get(k) for k in ("hostPID", "hostNetwork", "hostIPC"))

    ds["metadata"]["name"] = unique("xid-watcher")
    sel = {**ds["spec"]["selector"]["matchLabels"], "test": ds["metadata"]["name"]}
    ds["spec"]["selector"]["matchLabels"] = sel
    pod["metadata"]["labels"] = {**pod["metadata"]["labels"], **sel}
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    volumes["state"]["hostPath"]["path"] = str(tmp_path / "state")
    selector = ",".join(f"{k}={v}" for k, v in sel.items())

    # the same pod with the capability alone (no privileged), its own state folder
    denied = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": unique("xid-watcher-caps"), "labels": {"test": "xid-watcher-caps"}},
        "spec": copy.deepcopy(pod["spec"]),
    }
    denied["spec"]["restartPolicy"] = "Never"
    denied["spec"]["containers"][0]["securityContext"] = CAPS_ONLY
    denied["spec"]["containers"][0].pop("livenessProbe")
    denied["spec"]["volumes"] = [
        v if v["name"] != "state" else {"name": "state", "hostPath": {"path": str(tmp_path / "denied")}}
        for v in denied["spec"]["volumes"]
    ]
    (tmp_path / "denied").mkdir()

    r = c.http.post(f"/apis/apps/v1/namespaces/{NS}/daemonsets", json=ds)
    assert r.status_code == 201, r.text
    try:
        c.create(denied, NS)
        watcher = _running(c, selector)
        assert watcher["spec"]["nodeName"] == NODE
        wait_for(lambda: (h := _health(watcher)) and h["source_up"], 60, "the watcher reading /dev/kmsg")

        # without privileged the device is refused (the device cgroup): the watcher stops at once,
        # saying why, rather than running blind
        refused = denied["metadata"]["name"]
        assert c.wait_phase(refused, {"Succeeded", "Failed"}, 60) == "Failed"
        assert "error: --path: /dev/kmsg: Operation not permitted (" in c.logs(refused)

        bus = f"0000:{random.randrange(0x10, 0xF0):02x}:00"
        uuid = f"GPU-4e1d2f3a-5b6c-4d7e-8f90-{random.randrange(1 << 48):012x}"
        _write_kmsg(
            f"NVRM: GPU at PCI:{bus}: {uuid}",  # the driver's announcement at load
            f"NVRM: Xid (PCI:{bus}): 79, pid=0, GPU has fallen off the bus.",
        )
        (alert,) = sink.wait(bus, 10)
        assert alert["labels"] == {
            "alertname": FATAL_ALERT,
            "severity": "critical",
            "tier": load_catalog().tier_of(79).value,
            "xid": "79",
            SOURCE_LABEL: SOURCE_WATCHER,
            "Hostname": NODE,
            "pci_bus_id": bus,
            "UUID": uuid,  # no `gpu` index: a lab node has neither nvidia-smi nor the driver's procfs
        }, alert
        assert alert["annotations"]["message"] == "GPU has fallen off the bus."

        # a restarted watcher resumes after the line (the kernel's sequence number, saved on the
        # node): the line it handled is skipped, not seen again
        r = c.http.delete(f"/api/v1/namespaces/{NS}/pods/{watcher['metadata']['name']}")
        assert r.status_code == 200, r.text
        again = _running(c, selector, exclude=watcher["metadata"]["uid"])
        wait_for(lambda: (h := _health(again)) and h["source_up"], 60, "the restarted watcher reading")
        # once it has read a record newer than its cursor, it has passed every older one
        _write_kmsg("autoheal test: after the restart")
        wait_for(
            lambda: _metric(again, "autoheal_watcher_records_read") > 0, 20, "a record read after the cursor"
        )
        assert _metric(again, "autoheal_watcher_events_total") == 0
        assert _metric(again, "autoheal_watcher_records_skipped") > 0
        assert len(sink.matching(bus)) == 1
    finally:
        name = ds["metadata"]["name"]
        c.http.delete(
            f"/apis/apps/v1/namespaces/{NS}/daemonsets/{name}", params={"propagationPolicy": "Background"}
        )
        for p in [*_pods(c, selector), *_pods(c, "test=xid-watcher-caps")]:
            c.http.delete(
                f"/api/v1/namespaces/{NS}/pods/{p['metadata']['name']}", params={"gracePeriodSeconds": "0"}
            )
        wait_for(
            lambda: not _pods(c, selector) and not _pods(c, "test=xid-watcher-caps"),
            60,
            "the watcher pods gone",
        )
