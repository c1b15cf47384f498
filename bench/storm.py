"""A storm: hundreds of GPU nodes fail at once (a switch or power fault), on a 2,000-node lab.

Part 1, speed: a lab with one large pool of KWOK GPU nodes (Slurm nodes for all of them, slurmd
processes only for the first `--slurmd-limit`), a runner whose budget lets the whole storm through
(`max_nodes` >= storm, `max_pool_percent` 100). `--storm` distinct nodes fail at once: one POST of
that many alerts to the lab's Alertmanager. Measured from the POST until every one of them is
fenced, seen from outside the runner: Slurm DRAIN with an 'autoheal:' reason (`sinfo -N -R`) and
cordoned in Kubernetes (the API, `spec.unschedulable`). Target <= 30 s, i.e. >= 16 nodes/s (a widely
used open remediator does ~2.5 nodes/s). The runner's own journal times (phase `fenced`) are printed
too.

Then the full remediation of the storm, end to end: until every storm incident is closed, with
their states and reasons. The pool has `--spares` hot spares, so all but that many incidents find
none: they must complete "no spare: jobs wait for capacity" (the node fenced, evacuated, drained,
retired, the backfill asked) and the runner's notifications (to a webhook sink in this process)
must hold ONE `pool.spares_exhausted` for the pool, saying how many nodes wait, and no
`incident.failed`.

`--all-fail` instead fails every active node at once (a whole row, a bad driver push) with the
default budgets and `budgets.fence_held_nodes: true`: the breaker trips at the budget, and every
held node must still be fenced (drain + cordon) within 15 s, with nothing destructive done to any
node past the budget (no node DOWN, no spare promoted beyond the budget's runs).

Part 2, safety: the runner is restarted with a fresh journal and the default budgets of
remediation/config.py; `--budget-storm` other nodes fail at once. Proved from outside: no more nodes
than the budget were drained or cordoned, and the circuit breaker tripped (latched in the journal).

The lab's port block holds at most 2,600 nodes (lab.config.MAX_NODES): a larger `--nodes`
is cut to that and said so. The runner's own defaults (max_batch 100, 4 run slots, fence first with
2 fence slots) apply unless overridden.

    .venv/bin/python bench/storm.py [--nodes 2000] [--storm 500] [--budget-storm 50] [--port-base 29000]
                                    [--all-fail] [--name storm]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from autoheal.labels import REASON_PREFIX, SPARE_REASON
from lab import controlplane, procs, runner, slurm
from lab import lab as labmod
from lab.config import MAX_NODES, LabConfig, PoolConfig
from lab.sink import WebhookSink
from remediation.config import Budgets
from remediation.journal import Journal
from remediation.worker import NO_SPARE_REASON

TARGET_S = 30.0
WHOLE_FLEET_TARGET_S = 15.0
CLOSED = ("completed", "failed", "cancelled", "quarantined", "notified")
ANCHOR_NODES_PER_S = 2.5


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def post_alerts(cfg: LabConfig, nodes: list[str], ends: float | None = None) -> float:
    """One POST of one fatal-XID alert per node to Alertmanager; returns the time it was sent."""
    now = time.time()
    alerts: list[dict[str, Any]] = []
    for n in nodes:
        a: dict[str, Any] = {
            "labels": {
                "alertname": "GpuXidFatal",
                "Hostname": n,
                "gpu": "3",
                "xid": "79",
                "tier": "replace",
                "severity": "critical",
            },
            "annotations": {"summary": "bench/storm.py"},
            "startsAt": iso(now - 1),
        }
        if ends is not None:
            a["endsAt"] = iso(ends)
        alerts.append(a)
    r = httpx.post(cfg.url("alertmanager", "/api/v2/alerts"), json=alerts, timeout=30)
    r.raise_for_status()
    return now


def slurm_fenced(cfg: LabConfig) -> dict[str, str]:
    """Nodes drained (or down) in Slurm with a reason of ours (not the hot-spare reason)."""
    out = slurm.run(cfg, ["sinfo", "-h", "-N", "-R", "-o", "%N|%T|%E"], timeout=30)
    fenced: dict[str, str] = {}
    for row in out.splitlines():
        node, state, reason = [*row.split("|", 2), "", ""][:3]
        if (
            reason.startswith(REASON_PREFIX)
            and reason != SPARE_REASON
            and ("drain" in state or "down" in state)
        ):
            fenced[node.strip()] = reason
    return fenced


def kube_cordoned(http: httpx.Client) -> set[str]:
    r = http.get("/api/v1/nodes", params={"fieldSelector": "spec.unschedulable=true"})
    r.raise_for_status()
    return {n["metadata"]["name"] for n in r.json()["items"]}


def settle_nodes(http: httpx.Client, timeout: float, quiet: float = 5.0) -> tuple[float, int]:
    """Wait until no Node object has changed for `quiet` seconds; returns (seconds waited, nodes
    still changing at the end; 0 when settled). Why: the lab is 'up' once its nodes are Ready, but
    the controller manager goes on writing every new node (pod CIDR, taints) at ~100 patches/s for
    a minute after. A storm on that measures the lab's start-up as much as the fence (measured:
    4,775 of its node patches beside the fence's 1,990). A real storm hits a settled cluster."""
    t0 = time.monotonic()

    def versions() -> dict[str, str]:
        r = http.get("/api/v1/nodes", params={"resourceVersion": "0"})
        r.raise_for_status()
        return {n["metadata"]["name"]: n["metadata"]["resourceVersion"] for n in r.json()["items"]}

    before, since = versions(), time.monotonic()
    changing = len(before)
    while time.monotonic() - t0 < timeout:
        time.sleep(1.0)
        now = versions()
        changing = sum(1 for n, v in now.items() if before.get(n) != v)
        if changing:
            since = time.monotonic()
        elif time.monotonic() - since >= quiet:
            return round(time.monotonic() - t0, 1), 0
        before = now
    return round(time.monotonic() - t0, 1), changing


def watch_fenced(
    cfg: LabConfig, http: httpx.Client, nodes: list[str], t0: float, timeout: float
) -> tuple[dict[str, float], dict[str, float]]:
    """First time (s after t0) each node was seen drained in Slurm and cordoned in Kubernetes."""
    want = set(nodes)
    s_seen: dict[str, float] = {}
    k_seen: dict[str, float] = {}
    deadline = time.time() + timeout
    while time.time() < deadline and (len(s_seen) < len(want) or len(k_seen) < len(want)):
        now = time.time() - t0
        if len(s_seen) < len(want):
            for n in want & set(slurm_fenced(cfg)):
                s_seen.setdefault(n, now)
        now = time.time() - t0
        if len(k_seen) < len(want):
            try:
                for n in want & kube_cordoned(http):
                    k_seen.setdefault(n, now)
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    return s_seen, k_seen


def journal_fenced(path: Path, nodes: set[str], t0: float) -> tuple[list[float], dict[str, int], Any]:
    j = Journal(path)
    try:
        times = []
        for inc in j.incidents(limit=10_000):
            if inc.node in nodes:
                ts = [e.ts for e in j.timeline(inc.id) if e.phase == "fenced" and e.status == "ok"]
                if ts:
                    times.append(min(ts) - t0)
        return sorted(times), j.count_states(), j.setting("breaker")
    finally:
        j.close()


def stop_runner(cfg: LabConfig) -> int:
    """Stop the runner, then what its plays left running (ansible-playbook runs in a session of its
    own, async tasks and per-node CLI calls detach): every process whose command line names this
    lab's root and is ansible or the lab CLI, by PID."""
    procs.stop(cfg.run_dir, "runner")
    return kill_leftovers(cfg)


def kill_leftovers(cfg: LabConfig) -> int:
    root = str(cfg.root).encode()
    killed = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if root in cmd and (b"ansible" in cmd or b"autoheal lab" in cmd.replace(b"\0", b" ")):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def notify_sink() -> tuple[WebhookSink, list[dict[str, Any]]]:
    """A webhook sink in this process for the runner's notifications, and its override."""
    sink = WebhookSink(free_port()).start()
    return sink, [{"kind": "webhook", "url": f"http://127.0.0.1:{sink.port}/notify", "retries": 0}]


def events_by_kind(sink: WebhookSink) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in list(sink.deliveries):
        out.setdefault(str(d.payload.get("event")), []).append(d.payload)
    return out


def full_remediation(
    path: Path, nodes: set[str], t0: float, timeout: float, sink: WebhookSink
) -> dict[str, Any]:
    """Wait until every incident of `nodes` is closed; their states, reasons and the notifications."""
    deadline = time.time() + timeout
    while True:
        j = Journal(path)
        try:
            incs = [i for i in j.incidents(limit=10_000) if i.node in nodes]
        finally:
            j.close()
        closed = [i for i in incs if i.state in CLOSED]
        if (len(closed) == len(nodes) and len(incs) == len(nodes)) or time.time() > deadline:
            break
        time.sleep(2)
    time.sleep(3)  # the shortage's page goes out at the tick after the last run ends
    last = max((i.closed_at or i.updated_at for i in closed), default=t0)
    kinds = events_by_kind(sink)
    states: dict[str, int] = {}
    for i in incs:
        states[str(i.state)] = states.get(str(i.state), 0) + 1
    return {
        "incidents": len(incs),
        "closed": len(closed),
        "all_closed_s": round(last - t0, 1) if len(closed) == len(nodes) else None,
        "states": states,
        "no_spare": sum(1 for i in incs if i.reason.startswith(NO_SPARE_REASON)),
        "spares_exhausted_notifications": [
            {k: e.get(k) for k in ("pool", "waiting", "reason")}
            for e in kinds.get("pool.spares_exhausted", [])
        ],
        "notifications": {k: len(v) for k, v in kinds.items()},
    }


def report_full(f: dict[str, Any], n: int) -> None:
    pages = f["spares_exhausted_notifications"]
    print(f"\nfull remediation of the {n}-node storm (every incident closed):")
    print(
        f"  closed {f['closed']}/{n} in {f['all_closed_s']} s after the POST; states {f['states']};"
        f" 'no spare: jobs wait for capacity': {f['no_spare']}"
    )
    ok = len(pages) == 1 and not f["notifications"].get("incident.failed")
    print(
        f"  notifications: {f['notifications']}; spare exhaustion: {pages}"
        f"   target: one per pool, no incident.failed [{'ok' if ok else 'MISSED'}]",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--spares", type=int, default=10)
    ap.add_argument("--storm", type=int, default=500)
    ap.add_argument("--budget-storm", type=int, default=50)
    ap.add_argument("--slurmd-limit", type=int, default=8)
    ap.add_argument(
        "--gpus-per-node",
        type=int,
        default=1,
        help="simulated GPUs per node (2,000 x 8 GPUs: the simulator's /metrics misses the 1 s scrape)",
    )
    ap.add_argument("--max-batch", type=int, default=100)
    ap.add_argument("--max-concurrent-runs", type=int, default=4)
    ap.add_argument("--port-base", type=int, default=29000)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the storm's fencing")
    ap.add_argument("--settle", type=float, default=120.0, help="max seconds to let part 1's plays finish")
    ap.add_argument(
        "--settle-timeout",
        type=float,
        default=180.0,
        help="max seconds to wait, before the storm, for the control plane to stop writing the new nodes",
    )
    ap.add_argument("--root", type=Path, default=None)
    ap.add_argument(
        "--kube-timeout", type=float, default=600.0, help="seconds for the KWOK nodes to be Ready"
    )
    ap.add_argument("--skip-budget", action="store_true")
    ap.add_argument("--name", default="storm", help="the lab's name")
    ap.add_argument(
        "--all-fail",
        action="store_true",
        help="every active node fails at once; default budgets with fence_held_nodes (whole-fleet fence)",
    )
    ap.add_argument("--full-timeout", type=float, default=900.0, help="seconds for the full remediation")
    ap.add_argument(
        "--scale-probe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="first, one incident's wall time and API calls on this lab (bench/scale.py's large size)",
    )
    a = ap.parse_args()
    nodes = a.nodes
    if nodes > MAX_NODES:
        print(
            f"NOTE: {a.nodes} nodes asked, the lab's port block holds {MAX_NODES} "
            f"(lab.config.MAX_NODES): running with {MAX_NODES}"
        )
        nodes = MAX_NODES
    root = a.root or Path(tempfile.mkdtemp(prefix="autoheal-storm-"))
    cfg = LabConfig(
        name=a.name,
        root=root,
        port_base=a.port_base,
        pools=[PoolConfig(size=nodes - a.spares, spares=a.spares, headroom=0, gpus_per_node=a.gpus_per_node)],
        kube=True,
        runner=False,
        slurmd_limit=a.slurmd_limit,
        start_timeout=a.kube_timeout,
        grace_seconds=10,
        provision_delay=1,
        # alerts are posted to Alertmanager directly, so scraping is background load only: the
        # production interval (15 s; at 5 s Prometheus took ~45 % of a core scraping 2,000 nodes,
        # on the API server's two cores)
        interval="15s",
    )
    active = cfg.slurm_pools()[0].active_nodes()
    with_slurmd = set(labmod.slurmd_nodes(cfg))
    candidates = [n for n in active if n not in with_slurmd]
    storm = candidates[: a.storm]
    budget_nodes = candidates[a.storm : a.storm + a.budget_storm]
    if a.all_fail:
        storm, budget_nodes = list(active), []
        a.scale_probe, a.skip_budget = False, True
    results: dict[str, Any] = {"nodes": nodes, "storm": len(storm)}
    t_up = time.monotonic()
    try:
        labmod.up(cfg, lambda m: print(f"  lab: {m}", flush=True))
        results["lab_up_s"] = round(time.monotonic() - t_up, 1)
        print(f"lab up ({nodes} nodes, {len(with_slurmd)} slurmd): {results['lab_up_s']} s", flush=True)
        sink, notify = notify_sink()
        overrides: dict[str, Any] = {
            "budgets": {"max_nodes": max(600, a.storm + 1), "max_pool_percent": 100},
            "max_batch": a.max_batch,
            "max_concurrent_runs": a.max_concurrent_runs,
            "notify": notify,
        }
        if a.all_fail:  # the default budget, and the fence allowed past it
            overrides["budgets"] = {**Budgets().model_dump(), "fence_held_nodes": True}
            overrides["max_fence_batch"] = 2000  # the whole fleet in one drain (one scontrol hostlist)
        runner.start(cfg, overrides)
        journal1 = runner.journal_path(cfg)
        if a.scale_probe:
            import scale  # bench/scale.py, beside this file

            probe_node = candidates[-1]
            print(f"scale probe: one incident on {probe_node} of {nodes} nodes", flush=True)
            results["scale_probe"] = scale.measure_incident(cfg, probe_node, 300, 20)
            results["scale_probe"]["lab_up_s"] = results["lab_up_s"]
            scale.show(results["scale_probe"])
            (root / "storm.json").write_text(json.dumps(results, indent=2))
        with controlplane.http_client(cfg.kubeconfig, pool=4, timeout=30) as http:
            settled_s, changing = settle_nodes(http, a.settle_timeout)
            results["settle_nodes_s"], results["nodes_still_changing"] = settled_s, changing
            print(
                f"control plane settled (no node written for 5 s) after {settled_s} s"
                + (f"; NOT settled: {changing} nodes still changing" if changing else ""),
                flush=True,
            )
            # ---------------------------------------------------------------- part 1: speed
            t0 = post_alerts(cfg, storm)
            post_s = time.time() - t0
            s_seen, k_seen = watch_fenced(cfg, http, storm, t0, a.timeout)
            both = {n: max(s_seen[n], k_seen[n]) for n in storm if n in s_seen and n in k_seen}
            # the runner ingests a play's phase reports a moment after the play writes them
            deadline = time.time() + 15
            while True:
                jt, states, _ = journal_fenced(journal1, set(storm), t0)
                if len(jt) >= len(both) or time.time() > deadline:
                    break
                time.sleep(0.5)
            results["part1"] = {
                "post_s": round(post_s, 3),
                "fenced": len(both),
                "slurm_drained": len(s_seen),
                "kube_cordoned": len(k_seen),
                "all_fenced_s": round(max(both.values()), 2) if len(both) == len(storm) else None,
                "first_fenced_s": round(min(both.values()), 2) if both else None,
                "slurm_all_s": round(max(s_seen.values()), 2) if s_seen else None,
                "kube_all_s": round(max(k_seen.values()), 2) if k_seen else None,
                "journal_fenced": len(jt),
                "journal_p50_s": round(jt[len(jt) // 2], 2) if jt else None,
                "journal_max_s": round(jt[-1], 2) if jt else None,
                "incident_states": states,
            }
            report_part1(results["part1"], len(storm), a, WHOLE_FLEET_TARGET_S if a.all_fail else TARGET_S)
            if a.all_fail:
                results["all_fail"] = whole_fleet(cfg, journal1, set(storm), t0)
            else:
                results["full"] = full_remediation(journal1, set(storm), t0, a.full_timeout, sink)
                report_full(results["full"], len(storm))
            # let the plays finish (retire + backfill), bounded, so part 2 has the box to itself
            t_settle = time.monotonic()
            while time.monotonic() - t_settle < a.settle:
                _, states, _ = journal_fenced(journal1, set(), t0)
                if not states.get("running") and not states.get("admitted") and not states.get("pending"):
                    break
                time.sleep(2)
            _, states, _ = journal_fenced(journal1, set(), t0)
            results["part1"]["after_settle_states"] = states
            results["part1"]["settle_s"] = round(time.monotonic() - t_settle, 1)
            print(f"  after {results['part1']['settle_s']} s: incidents {states}", flush=True)
            killed = stop_runner(cfg)
            if killed:
                print(f"  stopped the runner and {killed} play(s) still running", flush=True)
            # resolve part 1's alerts in Alertmanager, so its repeats do not reach the next runner
            post_alerts(cfg, storm, ends=time.time())
            if not a.skip_budget:
                results["part2"] = part2(cfg, http, budget_nodes, set(storm))
    finally:
        stop_runner(cfg)
        labmod.down(cfg)
        kill_leftovers(cfg)
        out = root / "storm.json"
        out.write_text(json.dumps(results, indent=2))
        print(f"raw figures: {out}")


def whole_fleet(cfg: LabConfig, journal: Path, nodes: set[str], t0: float) -> dict[str, Any]:
    """After the whole fleet was fenced: the breaker's view, and that nothing destructive was done
    past the budget (only the budget's admitted incidents ran full runbooks)."""
    time.sleep(10)  # the admitted few run their full runbooks; anything past them would show now
    _, states, breaker = journal_fenced(journal, nodes, t0)
    out = slurm.run(cfg, ["sinfo", "-h", "-N", "-t", "down", "-o", "%N"], timeout=30)
    down = {n.strip() for n in out.split()} & nodes
    limit = Budgets().max_nodes
    res = {"breaker": breaker, "states": states, "down_nodes": len(down), "budget_limit": limit}
    ok = isinstance(breaker, dict) and bool(breaker.get("open")) and len(down) <= limit
    print(
        f"  breaker: {breaker}; incidents {states}; nodes set DOWN (destructive): {len(down)}"
        f"   target: breaker open, <= {limit} [{'ok' if ok else 'MISSED'}]",
        flush=True,
    )
    return res


def report_part1(p: dict[str, Any], n: int, a: argparse.Namespace, target: float = TARGET_S) -> None:
    print(f"\nstorm: {n} nodes fail at once (one POST of {n} alerts to Alertmanager, {p['post_s']} s)")
    print(f"  runner: max_batch {a.max_batch}, max_concurrent_runs {a.max_concurrent_runs}")
    if p["all_fenced_s"] is not None:
        rate = n / p["all_fenced_s"]
        verdict = "ok" if p["all_fenced_s"] <= target else "MISSED"
        print(
            f"  all {n} fenced (Slurm drained + cordoned): {p['all_fenced_s']:.1f} s = {rate:.1f} nodes/s"
            f"   target <= {target:.0f} s (>= {n / target:.1f} nodes/s) [{verdict}];"
            f" anchor {ANCHOR_NODES_PER_S} nodes/s"
        )
    else:
        print(
            f"  NOT all fenced within the timeout: {p['fenced']}/{n} fenced"
            f" (Slurm {p['slurm_drained']}, Kubernetes {p['kube_cordoned']})   target <= {TARGET_S:.0f} s"
        )
    print(
        f"  first node fenced: {p['first_fenced_s']} s; Slurm all drained: {p['slurm_all_s']} s;"
        f" Kubernetes all cordoned: {p['kube_all_s']} s"
    )
    print(
        f"  journal 'fenced' of {p['journal_fenced']} incidents: p50 {p['journal_p50_s']} s,"
        f" last {p['journal_max_s']} s after the POST; incidents {p['incident_states']}",
        flush=True,
    )


def part2(cfg: LabConfig, http: httpx.Client, nodes: list[str], earlier: set[str]) -> dict[str, Any]:
    b = Budgets()
    pool_size = sum(p.size + p.spares for p in cfg.pools)
    limit = max(1, min(b.max_nodes, int(pool_size * b.max_pool_percent // 100)))
    d = runner.runner_dir(cfg)
    journal2 = d / "journal-budget.sqlite"
    runner.start(
        cfg,
        {
            "budgets": b.model_dump(),
            "journal_path": str(journal2),
            "state_dir": str(d / "state-budget"),
        },
    )
    before_s = set(slurm_fenced(cfg))
    before_k = kube_cordoned(http)
    t0 = post_alerts(cfg, nodes)
    want = set(nodes)
    # wait for the breaker and for the admitted ones to be fenced, then a margin
    deadline = time.time() + 120
    breaker = None
    touched_s: set[str] = set()
    touched_k: set[str] = set()
    max_s = max_k = 0
    while time.time() < deadline:
        touched_s |= (set(slurm_fenced(cfg)) - before_s) & want
        touched_k |= (kube_cordoned(http) - before_k) & want
        max_s, max_k = max(max_s, len(touched_s)), max(max_k, len(touched_k))
        _, states, breaker = journal_fenced(journal2, set(), t0)
        if (
            isinstance(breaker, dict)
            and breaker.get("open")
            and len(touched_s) >= limit
            and len(touched_k) >= limit
        ):
            break
        time.sleep(0.5)
    time.sleep(10)  # anything that would overstep the budget has had time to show
    touched_s |= (set(slurm_fenced(cfg)) - before_s) & want
    touched_k |= (kube_cordoned(http) - before_k) & want
    others_s = (set(slurm_fenced(cfg)) - before_s) - want - earlier
    _, states, breaker = journal_fenced(journal2, want, t0)
    res = {
        "budget": b.model_dump(),
        "limit": limit,
        "failed": len(nodes),
        "slurm_drained": len(touched_s),
        "kube_cordoned": len(touched_k),
        "touched": len(touched_s | touched_k),
        "other_nodes_drained": len(others_s),
        "breaker": breaker,
        "incident_states": states,
    }
    ok = res["touched"] <= limit and isinstance(breaker, dict) and bool(breaker.get("open"))
    print(
        f"\nbudget: {len(nodes)} nodes fail at once, default budgets {b.model_dump()}"
        f" -> limit {limit} node(s)"
    )
    print(
        f"  touched: {res['touched']} node(s) (Slurm drained {len(touched_s)}, cordoned {len(touched_k)},"
        f" other nodes {len(others_s)})   target <= {limit}"
        f" [{'ok' if res['touched'] <= limit else 'EXCEEDED'}]"
    )
    print(f"  circuit breaker: {breaker}   target: open (latched) [{'ok' if ok else 'NOT TRIPPED'}]")
    print(f"  incidents: {states}", flush=True)
    return res


if __name__ == "__main__":
    main()
