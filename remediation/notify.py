"""Notifications to humans: a generic JSON webhook and a Slack-compatible sink.

Sending never blocks the runner: events go onto a bounded queue that one background thread
drains, retrying each sink with backoff; when the queue is full the event is dropped and counted
(the journal still has it). Messages carry typed fields only (incident id, node, tier, state,
reason), never raw alert annotations.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any

import httpx

from remediation.config import NotifySink
from remediation.metrics import Metrics

log = logging.getLogger(__name__)


def slack_text(event: dict[str, Any]) -> str:
    parts = [f"autoheal: {event.get('event', 'event')}"]
    for key in ("incident", "node", "tier", "state", "reason"):
        if event.get(key) not in (None, ""):
            parts.append(f"{key}={event[key]}")
    return " ".join(parts)


class Notifier:
    def __init__(
        self,
        sinks: tuple[NotifySink, ...],
        metrics: Metrics | None = None,
        maxsize: int = 1000,
        backoff: float = 0.5,
    ) -> None:
        self.sinks = sinks
        self.metrics = metrics
        self.backoff = backoff
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None
        self.sent: list[dict[str, Any]] = []  # kept (bounded) for tests and `incident show`

    def start(self) -> None:
        if self.sinks and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="autoheal-notify", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout)
            self._thread.join(timeout)
            self._thread = None

    def send(self, event: str, **fields: Any) -> None:
        """Queue a notification; returns at once."""
        body = {"event": event, "ts": time.time(), **fields}
        if len(self.sent) < 1000:
            self.sent.append(body)
        if not self.sinks:
            return
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self._count("all", "dropped")

    def _count(self, sink: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.notifications.labels(sink=sink, outcome=outcome).inc()

    def _loop(self) -> None:
        with httpx.Client() as client:
            while True:
                body = self._queue.get()
                if body is None:
                    return
                for sink in self.sinks:
                    self._deliver(client, sink, body)

    def _deliver(self, client: httpx.Client, sink: NotifySink, body: dict[str, Any]) -> None:
        payload = {"text": slack_text(body)} if sink.kind == "slack" else body
        for attempt in range(sink.retries + 1):
            try:
                resp = client.post(str(sink.url), json=payload, timeout=sink.timeout_seconds)
                if resp.status_code < 500 and resp.status_code != 429:
                    self._count(sink.kind, "sent" if resp.is_success else "refused")
                    return
            except httpx.HTTPError as exc:
                log.warning("notify %s: %s", sink.kind, exc)
            time.sleep(self.backoff * (2**attempt))
        self._count(sink.kind, "failed")
