"""The watcher's own health, as Prometheus metrics, and a /healthz for its liveness probe.

A detector that dies quietly is worse than none: these say whether the kernel log is being read
(`autoheal_watcher_source_up`, the records read and lost), whether Alertmanager takes the alerts
(`autoheal_watcher_alertmanager_up`, posts and errors, alerts waiting), and what was seen
(driver events by kind and XID, alerts offered by outcome: new, deduplicated, overflow).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class WatcherMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.records = Gauge(
            "autoheal_watcher_records_read", "Kernel log records handled since start.", registry=r
        )
        self.skipped = Gauge(
            "autoheal_watcher_records_skipped",
            "Records skipped: handled before a restart, or older than a first start's replay window.",
            registry=r,
        )
        self.lost = Gauge(
            "autoheal_watcher_records_lost",
            "Kernel log records overwritten before they were read (sequence gaps) since start.",
            registry=r,
        )
        self.garbage = Gauge(
            "autoheal_watcher_records_garbage",
            "Input that was not a kernel log record, since start.",
            registry=r,
        )
        self.source_up = Gauge(
            "autoheal_watcher_source_up", "1 while the kernel log source is open.", registry=r
        )
        self.events = Counter(
            "autoheal_watcher_events_total",
            "Driver events parsed, by kind and XID/SXID.",
            ["kind", "code"],
            registry=r,
        )
        self.offered = Counter(
            "autoheal_watcher_alerts_offered_total",
            "Alert occurrences, by outcome (new, refresh, dedup, overflow).",
            ["outcome"],
            registry=r,
        )
        self.posts = Counter("autoheal_watcher_posts_total", "Batches Alertmanager accepted.", registry=r)
        self.posted = Counter(
            "autoheal_watcher_alerts_posted_total", "Alerts Alertmanager accepted.", registry=r
        )
        self.post_errors = Counter(
            "autoheal_watcher_post_errors_total", "Batches no Alertmanager accepted.", registry=r
        )
        self.am_up = Gauge(
            "autoheal_watcher_alertmanager_up",
            "1 when the last post was accepted, 0 when it failed.",
            registry=r,
        )
        self.pending = Gauge("autoheal_watcher_alerts_pending", "Alerts waiting to be posted.", registry=r)
        self.gpus = Gauge("autoheal_watcher_gpus_known", "GPUs in the bus id map.", registry=r)
        self.last_event = Gauge(
            "autoheal_watcher_last_event_timestamp_seconds",
            "When the last driver event was read.",
            registry=r,
        )
        self.am_up.set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve(
    metrics: WatcherMetrics, host: str, port: int, health: Callable[[], dict[str, Any]]
) -> ThreadingHTTPServer:
    """GET /metrics and /healthz (503 when a worker thread has died) in a background thread."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/metrics":
                code, body, ctype = 200, metrics.render(), "text/plain; version=0.0.4"
            elif self.path == "/healthz":
                h = health()
                code, body, ctype = (200 if h["ok"] else 503), json.dumps(h).encode(), "application/json"
            else:
                code, body, ctype = 404, b"not found\n", "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="watcher-http", daemon=True).start()
    return server
