"""Benchmark of the remediation runner, against a real `python -m remediation serve` on 127.0.0.1.

1. webhook acceptance: alerts/s and p99 latency of POST /webhook including the durable journal
   commit (runner paused, so only the webhook path is measured); targets >= 500/s, p99 <= 50 ms.
2. receipt -> the play's first task: p99 over sequential single-node alerts with the stub
   playbook (tests/remediation/playbooks); target <= 2 s.
3. storm: 500 distinct node alerts, time until every incident has a policy decision; target <= 10 s.

    .venv/bin/python bench/webhook.py [--requests 3000] [--concurrency 8] [--samples 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from lab.stats import pct

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "remediation" / "playbooks"
TOKEN = "bench-token-0123456789abcdef"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alert_payload(nodes: list[str], xid: int = 79) -> dict[str, Any]:
    alerts = [
        {
            "status": "firing",
            "labels": {"alertname": "GpuXidFatal", "Hostname": n, "xid": str(xid), "gpu": "0"},
            "annotations": {"summary": "bench"},
            "startsAt": "2026-11-30T03:46:01Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://bench",
            "fingerprint": format(abs(hash(n)) % (1 << 60), "x"),
        }
        for n in nodes
    ]
    return {
        "version": "4",
        "status": "firing",
        "receiver": "bench",
        "groupKey": "{}",
        "truncatedAlerts": 0,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://bench",
        "alerts": alerts,
    }


class Runner:
    """A runner process in a tmp dir; stopped by PID."""

    def __init__(self, tmp: Path, *, paused: bool, max_nodes: int = 1000) -> None:
        self.tmp = tmp
        self.port = free_port()
        (tmp / "token").write_text(TOKEN)
        (tmp / "rules.yaml").write_text(
            yaml.safe_dump(
                [
                    {
                        "name": "bench",
                        "rules": [
                            {
                                "name": "xid",
                                "condition": 'event.alert.labels.alertname == "GpuXidFatal"',
                                "action": {"run_playbook": {"name": "gpu_fatal_xid.yml"}},
                            }
                        ],
                    }
                ]
            )
        )
        (tmp / "runner.yaml").write_text(
            yaml.safe_dump(
                {
                    "listen_port": self.port,
                    "token_file": "token",
                    "journal_path": "journal.sqlite",
                    "rules_file": "rules.yaml",
                    "playbook_dir": str(STUBS),
                    "state_dir": "state",
                    "budgets": {"max_nodes": max_nodes, "max_pool_percent": 100},
                    "node_cap": {"max_incidents": 1000, "window_seconds": 60},
                    "batch_window_seconds": 0.1,
                    "poll_seconds": 0.2,
                    "max_batch": 100,
                }
            )
        )
        if paused:
            subprocess.run(
                [sys.executable, "-m", "remediation", "pause", "--config", str(tmp / "runner.yaml")],
                cwd=REPO,
                check=True,
                stdout=subprocess.DEVNULL,
            )
        self.log = (tmp / "serve.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "remediation", "serve", "--config", str(tmp / "runner.yaml")],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise SystemExit(f"runner did not start; see {tmp / 'serve.log'}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.tmp / "journal.sqlite", timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def _connection(port: int, requests: list[bytes], latencies: list[float]) -> int:
    """One keep-alive HTTP/1.1 connection sending `requests` in turn; returns the non-200 count.

    A raw-socket client keeps the load generator's own CPU small: on a 2-core box a full HTTP
    client library would take as much CPU as the server under test.
    """
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    errors = 0
    try:
        for req in requests:
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(m.group(1)) if m else 0)
            latencies.append(time.perf_counter() - t0)
            if head[9:12] != b"200":
                errors += 1
    finally:
        writer.close()
    return errors


def _request(port: int, body: bytes) -> bytes:
    return (
        f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _acceptance(port: int, n: int, concurrency: int, prefix: str) -> tuple[float, list[float], int]:
    reqs = [_request(port, json.dumps(alert_payload([f"{prefix}-{i}"])).encode()) for i in range(n)]
    latencies: list[float] = []
    t0 = time.perf_counter()
    errors = await asyncio.gather(
        *(_connection(port, reqs[c::concurrency], latencies) for c in range(concurrency))
    )
    elapsed = time.perf_counter() - t0
    return n / elapsed, latencies, sum(errors)


def bench_acceptance(n: int, concurrency: int) -> tuple[float, float, float, int]:
    with tempfile.TemporaryDirectory(prefix="autoheal-bench-") as tmp:
        runner = Runner(Path(tmp), paused=True)
        try:
            asyncio.run(_acceptance(runner.port, 200, concurrency, "warm"))
            rate, lat, errors = asyncio.run(_acceptance(runner.port, n, concurrency, "bench"))
            with runner.db() as db:
                journaled = db.execute("SELECT COUNT(*) FROM alerts").fetchone()[0]
            assert journaled == n + 200, (journaled, n)
        finally:
            runner.stop()
    return rate, pct(lat, 50) * 1000, pct(lat, 99) * 1000, errors


def bench_first_task(samples: int) -> list[float]:
    out = []
    with tempfile.TemporaryDirectory(prefix="autoheal-bench-") as tmp:
        runner = Runner(Path(tmp), paused=False)
        try:
            with httpx.Client(timeout=30) as client:
                for i in range(samples):
                    t0 = time.time()
                    r = client.post(
                        f"{runner.url}/webhook", json=alert_payload([f"lat-{i}"]), headers=HEADERS
                    )
                    iid = r.json()["created"][0]
                    deadline = time.time() + 60
                    first = None
                    while time.time() < deadline:
                        with runner.db() as db:
                            row = db.execute(
                                "SELECT MIN(s.started_at), MAX(i.state IN ('completed','failed'))"
                                " FROM incidents i JOIN steps s ON s.run_id = i.run_id"
                                " WHERE i.id=?",
                                (iid,),
                            ).fetchone()
                        if row[0] is not None:
                            first = row[0]
                        if row[1]:
                            break
                        time.sleep(0.05)
                    if first is None:
                        raise SystemExit(f"no task started for {iid}; see {tmp}/serve.log")
                    out.append(first - t0)
        finally:
            runner.stop()
    return out


def bench_storm(nodes: int) -> tuple[float, int, int]:
    with tempfile.TemporaryDirectory(prefix="autoheal-bench-") as tmp:
        runner = Runner(Path(tmp), paused=False, max_nodes=5)
        try:
            names = [f"storm-{i}" for i in range(nodes)]
            t0 = time.time()
            with httpx.Client(timeout=30) as client:
                # Alertmanager groups by node: one delivery per node
                for n in names:
                    client.post(f"{runner.url}/webhook", json=alert_payload([n]), headers=HEADERS)
            deadline = t0 + 60
            while time.time() < deadline:
                with runner.db() as db:
                    (undecided,) = db.execute(
                        "SELECT COUNT(*) FROM incidents WHERE state='pending'"
                    ).fetchone()
                    (total,) = db.execute("SELECT COUNT(*) FROM incidents").fetchone()
                if total == nodes and undecided == 0:
                    break
                time.sleep(0.05)
            elapsed = time.time() - t0
            with runner.db() as db:
                states = dict(db.execute("SELECT state, COUNT(*) FROM incidents GROUP BY state").fetchall())
        finally:
            runner.stop()
    ran = sum(v for k, v in states.items() if k != "held")
    return elapsed, ran, states.get("held", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--storm", type=int, default=500)
    args = ap.parse_args()

    rate, p50, p99, errors = bench_acceptance(args.requests, args.concurrency)
    first = bench_first_task(args.samples)
    storm_s, ran, held = bench_storm(args.storm)

    rows = [
        ("webhook acceptance (journaled)", f"{rate:.0f} alerts/s", ">= 500 alerts/s", rate >= 500),
        ("webhook latency p50", f"{p50:.1f} ms", "", True),
        ("webhook latency p99", f"{p99:.1f} ms", "<= 50 ms", p99 <= 50),
        ("webhook errors", str(errors), "0", errors == 0),
        ("receipt -> first task p50", f"{statistics.median(first):.2f} s", "", True),
        (
            f"receipt -> first task p99 (n={len(first)})",
            f"{pct(first, 99):.2f} s",
            "<= 2 s",
            pct(first, 99) <= 2,
        ),
        (f"storm of {args.storm}: all decided", f"{storm_s:.2f} s", "<= 10 s", storm_s <= 10),
        ("storm: admitted (budget 5) / held", f"{ran} / {held}", "5 / rest", ran <= 5),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'figure':>16}  {'target':>16}  ok")
    for name, fig, target, ok in rows:
        print(f"{name:<{width}}  {fig:>16}  {target:>16}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
