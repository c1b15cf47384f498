"""Detection latency: fault -> webhook through the metric path (1 s and 15 s Prometheus intervals)
beside the XID watcher path, and fault -> fenced (Slurm drain + cordon) through the watcher path.

Each path runs in a lab of its own, so one path's alert never shares an Alertmanager group with
the other's (a group that is already notifying holds new alerts for `group_interval`):
  metric @1s    Prometheus scrapes and evaluates every 1 s (the lab's default), watchers off
  metric @15s   every 15 s (production is 15-30 s), watchers off
  watcher       the kernel-log watchers on, Prometheus at 15 s (the watcher does not depend on it)
  fence         Kubernetes (KWOK) + the runner, watchers on, Prometheus at 15 s; the GPU's series
                vanish (XID 79 as on real hardware): only the watcher and the lost-GPU rule see it
Every trial is a fresh fault on a node with no alert group in Alertmanager, as a first fault on a
healthy node is: an emptied group lingers until Alertmanager's 30 s maintenance, and an alert that
joins it waits for the group's next `group_interval` tick, so each detection lab has a node per
trial (up to 30; beyond that a node is reused 31 s after its last alert ended). Each fault lands
at a random moment within one scrape interval (faults do not wait for scrapes).
Prints p50/p99/max beside the targets (issue 16): watcher path
fault -> webhook <= 1 s p99; fault -> fenced <= 2 s p99 (5.0 s through the metric path before).

    .venv/bin/python bench/detection.py [--trials 20] [--slow-trials 8] [--fence-trials 10]
                                        [--port-base 18000] [--no-fence]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lab import lab as labmod
from lab import pool, runner, slurm
from lab.config import LabConfig, PoolConfig
from lab.sink import WebhookSink
from lab.stats import pct

NODES = 4  # active nodes per lab; spares stay spares
GROUP_GC_S = 31.0  # Alertmanager drops an emptied aggregation group every 30 s


def line(name: str, xs: list[float], target: str) -> str:
    if not xs:
        return f"{name:34s}  (no trial reached it)   target {target}"
    return (
        f"{name:34s}  p50 {pct(xs, 50):6.2f} s  p99 {pct(xs, 99):6.2f} s  max {max(xs):6.2f} s"
        f"  (n={len(xs)})  target {target}"
    )


def lab_config(
    root: Path, name: str, port_base: int, interval: str, watchers: bool, full: bool, nodes: int = NODES
) -> LabConfig:
    return LabConfig(
        name=name,
        root=root,
        port_base=port_base,
        pools=[PoolConfig(size=max(NODES, nodes - 2), spares=2, headroom=12 if full else 0)],
        webhook_url=None if full else f"http://127.0.0.1:{port_base + 6}/webhook",
        interval=interval,
        watchers=watchers,
        kube=full,
        runner=full,
        grace_seconds=10,
        provision_delay=1.0,
    )


def sim(cfg: LabConfig, path: str, body: dict[str, Any]) -> None:
    r = httpx.post(cfg.url("simulator", path), json=body, timeout=5)
    r.raise_for_status()


def wait_fresh(cfg: LabConfig, node: str, used: bool, timeout: float = 180) -> None:
    """Until `node` has no alert group in Alertmanager: no alert of it, and (if it had one) 31 s
    since its alerts ended, for the group to be dropped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        groups = httpx.get(cfg.url("alertmanager", "/api/v2/alerts/groups"), timeout=5).json()
        if not any(g["labels"].get("Hostname") == node and g["alerts"] for g in groups):
            if used:
                time.sleep(GROUP_GC_S)
            return
        time.sleep(0.5)
    raise SystemExit(f"alerts of {node} did not clear within {timeout:.0f}s")


def webhook_trials(cfg: LabConfig, trials: int, source: str, timeout: float, interval: float) -> list[float]:
    """Inject XID 79 on a fresh node and GPU each trial; seconds until the webhook carries the
    alert of `source`."""
    token = (cfg.run_dir / "runner.token").read_text().strip()
    sink = WebhookSink(cfg.port("sink"), token).start()
    nodes = labmod.hardware_nodes(cfg)  # spares too: detection does not care
    out: list[float] = []
    try:
        for i in range(trials):
            node, gpu = nodes[i % len(nodes)], (i // len(nodes)) % 8
            wait_fresh(cfg, node, used=i >= len(nodes))
            time.sleep(random.uniform(0, interval))
            t = time.time()
            sim(cfg, "/v1/xid", {"node": node, "gpu": gpu, "xid": 79})
            try:
                d = sink.wait_for({"Hostname": node, "gpu": str(gpu), "source": source}, timeout, since=t)
                out.append(d.at - t)
                print(f"  {source:8s} trial {i + 1:2d}: {node} GPU {gpu}: {d.at - t:6.3f} s", flush=True)
            except TimeoutError:
                print(
                    f"  {source:8s} trial {i + 1:2d}: {node} GPU {gpu}: no webhook in {timeout:.0f} s",
                    flush=True,
                )
            finally:
                sim(cfg, "/v1/clear", {"node": node})
    finally:
        sink.stop()
    return out


def _active_node(cfg: LabConfig, used: set[str]) -> str:
    """An active pool member (not a spare, not drained) not used by an earlier trial."""
    members = pool.client_status(cfg)["pools"]["h100"]["members"]
    states = slurm.node_states(cfg)
    for n in members:
        st = states.get(n, {})
        if n not in used and "DRAIN" not in st.get("state", "DRAIN") and "DOWN" not in st.get("state", ""):
            return n
    raise SystemExit("no active node left to fail")


def _settle(cfg: LabConfig, timeout: float = 240) -> None:
    """Until no incident is open and the pool has its spares back (replacements provisioned)."""
    from remediation.journal import Journal

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = pool.client_status(cfg)["pools"]["h100"]
        j = Journal(runner.journal_path(cfg))
        try:
            open_ = j.incidents(["pending", "admitted", "running", "held"])
        finally:
            j.close()
        if not open_ and not st["pending"] and len(st["members"]) == st["declared"]:
            return
        time.sleep(1)
    raise SystemExit(f"the lab did not settle within {timeout:.0f}s")


def fence_trials(cfg: LabConfig, trials: int, timeout: float) -> list[dict[str, Any]]:
    """XID 79 with the GPU's series vanishing; read the runner's journal for received and fenced."""
    from remediation.journal import Journal

    used: set[str] = set()
    out: list[dict[str, Any]] = []
    for i in range(trials):
        if i:
            _settle(cfg)
        node = _active_node(cfg, used)
        used.add(node)
        t = time.time()
        sim(cfg, "/v1/xid", {"node": node, "gpu": 2, "xid": 79, "vanish": True})
        rec: dict[str, Any] = {"trial": i + 1, "node": node}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and "fenced_s" not in rec:
            j = Journal(runner.journal_path(cfg))
            try:
                incs = [x for x in j.incidents() if x.node == node and x.opened_at >= t - 1]
                for inc in incs:
                    rec["received_s"] = inc.opened_at - t
                    rec["incident"] = inc.id
                    fenced = [e.ts for e in j.timeline(inc.id) if e.phase == "fenced" and e.status == "ok"]
                    if fenced:
                        rec["fenced_s"] = min(fenced) - t
                    sources = {json.loads(a["labels"]).get("source") for a in j.alerts(inc.id)}
                    rec["sources"] = sorted(s for s in sources if s)
            finally:
                j.close()
            time.sleep(0.1)
        out.append(rec)
        got = ", ".join(f"{k} {v:.2f} s" for k, v in rec.items() if k.endswith("_s"))
        print(
            f"  fence    trial {i + 1:2d}: {node}: {got or 'not fenced'} {rec.get('sources', '')}", flush=True
        )
    return out


def run_lab(cfg: LabConfig, what: str) -> LabConfig:
    t0 = time.monotonic()
    labmod.up(cfg)
    print(f"{what}: lab up in {time.monotonic() - t0:.1f} s", flush=True)
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20, help="watcher and metric @1s trials")
    ap.add_argument("--slow-trials", type=int, default=8, help="metric @15s trials")
    ap.add_argument("--fence-trials", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=18000)
    ap.add_argument("--no-fence", action="store_true", help="skip the Kubernetes + runner lab")
    ap.add_argument("--fence-only", action="store_true", help="only the Kubernetes + runner lab")
    ap.add_argument("--name-prefix", default="", help="prefix of the labs' names (two benches side by side)")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="autoheal-detect-"))
    results: dict[str, Any] = {}
    plans: list[tuple[str, str, bool, int, str, float]] = [
        ("metric @1s", "1s", False, a.trials, "dcgm", 15.0),
        ("metric @15s", "15s", False, a.slow_trials, "dcgm", 60.0),
        ("watcher", "15s", True, a.trials, "watcher", 10.0),
    ]
    for what, interval, watchers, n, source, timeout in [] if a.fence_only else plans:
        cfg = lab_config(
            root,
            a.name_prefix + "det" + interval.rstrip("s") + ("w" if watchers else "m"),
            a.port_base,
            interval,
            watchers,
            False,
            nodes=min(30, n),
        )
        try:
            run_lab(cfg, what)
            results[what] = webhook_trials(cfg, n, source, timeout, float(interval.rstrip("s")))
        finally:
            labmod.down(cfg)
    if not a.no_fence:
        # a fresh active node per trial: spares promoted in earlier trials are not used twice
        nodes = a.fence_trials + 2
        cfg = lab_config(root, f"{a.name_prefix}detfence", a.port_base, "15s", True, True, nodes=nodes)
        try:
            run_lab(cfg, "fence (Kubernetes + runner)")
            results["fence"] = fence_trials(cfg, a.fence_trials, 60.0)
        finally:
            labmod.down(cfg)
    out = root / "detection.json"
    out.write_text(json.dumps(results, indent=2))
    labels = {
        "metric @1s": ("metric path, 1 s scrape/evaluation", "(lab anchor ~1.0 s)"),
        "metric @15s": ("metric path, 15 s scrape/evaluation", "(production intervals)"),
        "watcher": ("watcher path (kernel log)", "<= 1 s p99"),
    }
    if not a.fence_only:
        print("\nfault -> webhook received (XID 79 injected -> Alertmanager's webhook)")
    for key, (name, target) in labels.items():
        if key in results:
            print("  " + line(name, results[key], target))
    if "fence" in results:
        f = results["fence"]
        print("fault -> runner / fenced, watcher path (GPU series vanish: no XID sample at all)")
        print("  " + line("fault -> incident opened", [x["received_s"] for x in f if "received_s" in x], ""))
        print(
            "  "
            + line(
                "fault -> fenced (drain + cordon)",
                [x["fenced_s"] for x in f if "fenced_s" in x],
                "<= 2 s p99",
            )
        )
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
