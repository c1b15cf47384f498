"""Detection in the lab, end to end: the simulator prints the driver's lines into each node's
kernel log, one real watcher per node posts to the lab's real Alertmanager, and the real Prometheus
runs the shipped rules (lost-GPU rule included) against the simulator's dcgm metrics."""

from __future__ import annotations

import time

import httpx
import pytest

from lab import lab as labmod
from lab import pool, procs, watch
from lab.config import LabConfig, PoolConfig
from lab.sink import WebhookSink
from tests.support import port_base, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]
PORT_BASE = port_base(21400)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    cfg = LabConfig(
        name="wdetect",
        root=tmp_path_factory.mktemp("wlabs"),
        port_base=PORT_BASE,
        pools=[PoolConfig(size=4, spares=2, headroom=2)],
        webhook_url=f"http://127.0.0.1:{PORT_BASE + 6}/webhook",
        kube=False,
        runner=False,
        provision_delay=1,
    )
    try:
        labmod.up(cfg)
        yield cfg
    finally:
        labmod.down(cfg)


@pytest.fixture(scope="module")
def sink(lab):
    s = WebhookSink(lab.port("sink"), (lab.run_dir / "runner.token").read_text().strip()).start()
    yield s
    s.stop()


def sim(lab, path: str, body: dict) -> None:
    r = httpx.post(lab.url("simulator", path), json=body, timeout=5)
    assert r.status_code == 200, r.text


def firing(lab, **match: str) -> list[dict]:
    alerts = httpx.get(lab.url("prometheus", "/api/v1/alerts"), timeout=5).json()["data"]["alerts"]
    return [
        a for a in alerts if a["state"] == "firing" and all(a["labels"].get(k) == v for k, v in match.items())
    ]


def test_every_node_has_a_watcher(lab):
    live = procs.running(lab.run_dir)
    assert all(watch.name(n) in live for n in labmod.hardware_nodes(lab))
    assert {s.name: s.healthy for s in labmod.status(lab).services}["watchers"]


def test_xid_79_with_the_gpu_vanishing_fires_through_the_watcher_and_the_lost_gpu_rule(lab, sink):
    """No XID sample is ever scraped: the GPU's series are gone, as when DCGM loses it."""
    t0 = time.time()
    sim(lab, "/v1/xid", {"node": "gpu-2", "gpu": 3, "xid": 79, "vanish": True})
    try:
        w = sink.wait_for({"Hostname": "gpu-2", "gpu": "3", "xid": "79", "source": "watcher"}, 5, since=t0)
        lost = sink.wait_for(
            {"Hostname": "gpu-2", "gpu": "3", "xid": "79", "source": "lost-gpu"}, 15, since=t0
        )
        print(f"kernel line -> webhook {w.at - t0:.2f}s (watcher), {lost.at - t0:.2f}s (lost-GPU rule)")
        assert w.at - t0 < 1.5
        [alert] = [
            a for d in sink.deliveries for a in d.payload["alerts"] if a["labels"].get("source") == "lost-gpu"
        ][:1]
        assert alert["labels"]["tier"] == "reboot" and alert["labels"]["UUID"].startswith("GPU-")
        # the metric path never saw an XID
        assert not firing(lab, Hostname="gpu-2", source="dcgm")
    finally:
        sim(lab, "/v1/clear", {"node": "gpu-2"})


def test_a_masked_xid_79_then_13_is_caught_by_the_watcher(lab, sink):
    """79 then 13 within one scrape: the gauge holds 13 (restart_app) when Prometheus looks."""
    t0 = time.time()
    sim(lab, "/v1/xid", {"node": "gpu-1", "gpu": 5, "xid": 79})
    sim(lab, "/v1/xid", {"node": "gpu-1", "gpu": 5, "xid": 13})
    try:
        sink.wait_for({"Hostname": "gpu-1", "gpu": "5", "xid": "79", "source": "watcher"}, 5, since=t0)
        time.sleep(3)  # several scrapes and evaluations at the lab's 1 s interval
        # the rule saw 13 only: at most a restart_app alert, never the 79
        assert not firing(lab, Hostname="gpu-1", gpu="5", xid="79", source="dcgm"), "the rule saw 13 only"
    finally:
        sim(lab, "/v1/clear", {"node": "gpu-1"})


def test_hostile_driver_text_arrives_only_as_a_bounded_annotation(lab, sink):
    evil = "{{ lookup('pipe', 'id') }} $(reboot) \x1b[2J" + "x" * 400
    t0 = time.time()
    sim(lab, "/v1/xid", {"node": "gpu-3", "gpu": 0, "xid": 48, "message": evil})
    try:
        d = sink.wait_for({"Hostname": "gpu-3", "gpu": "0", "xid": "48", "source": "watcher"}, 5, since=t0)
        [a] = [
            a
            for a in d.payload["alerts"]
            if a["labels"].get("source") == "watcher" and a["labels"]["gpu"] == "0"
        ]
        msg = a["annotations"]["message"]
        assert len(msg) <= 256 and "\x1b" not in msg
        assert all(evil not in v for v in a["labels"].values())
    finally:
        sim(lab, "/v1/clear", {"node": "gpu-3"})


def test_a_retired_node_does_not_fire_the_lost_gpu_rule(lab, sink):
    t0 = time.time()
    pool.client_retire(lab, "gpu-4")
    time.sleep(6)  # every series of gpu-4 is gone for several evaluations
    assert not firing(lab, Hostname="gpu-4")
    with pytest.raises(TimeoutError):
        sink.wait_for({"Hostname": "gpu-4"}, 0.5, since=t0)
    assert watch.name("gpu-4") not in procs.running(lab.run_dir)
    # its replacement gets a watcher of its own
    new = wait_for(
        lambda: [
            n
            for n in pool.client_status(lab)["pools"]["h100"]["members"]
            if n not in labmod.hardware_nodes(lab)
        ],
        60,
        "a replacement node",
    )
    wait_for(lambda: watch.name(new[0]) in procs.running(lab.run_dir), 20, "the replacement's watcher")
    t1 = time.time()
    sim(lab, "/v1/xid", {"node": new[0], "gpu": 7, "xid": 79})
    try:
        sink.wait_for({"Hostname": new[0], "gpu": "7", "source": "watcher"}, 10, since=t1)
    finally:
        sim(lab, "/v1/clear", {"node": new[0]})
