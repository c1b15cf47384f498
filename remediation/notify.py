"""Notifications to humans: a generic JSON webhook and a Slack-compatible sink.

Sending never blocks the runner: events go onto a bounded queue that one background thread
drains, retrying each sink with the core's backoff (autoheal/backoff.py: no wait after the last
try, and stop() ends a wait); when the queue is full the event is dropped and counted (the journal
still has it). Messages carry typed fields only (incident id, node, tier, state,
reason), never raw alert annotations.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from autoheal.backoff import Backoff
from remediation.config import NotifySink
from remediation.metrics import Metrics

log = logging.getLogger(__name__)


def slack_text(event: dict[str, Any]) -> str:
    parts = [f"autoheal: {event.get('event', 'event')}"]
    for key in ("incident", "node", "pool", "waiting", "tier", "state", "reason"):
        if event.get(key) not in (None, ""):
            parts.append(f"{key}={event[key]}")
    return " ".join(parts)


class SinkBusy(Exception):
    """A sink answered 5xx or 429: worth another try, unlike any other answer."""


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
        # set by stop(): a retry waiting on it ends at once, and no failed send is tried again
        self._stop = threading.Event()
        self.sent: list[dict[str, Any]] = []  # kept (bounded) for tests and `incident show`

    def start(self) -> None:
        if self.sinks and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="autoheal-notify", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is not None:
            self._stop.set()  # what is queued still gets one try each, none a retry
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
        self.post(client, sink, payload)

    def post(self, client: httpx.Client, sink: NotifySink, payload: dict[str, Any]) -> str:
        """One payload to one sink through the retry stage, in the caller's thread (the owner loop
        sends its own messages so): "sent", "refused" (4xx: final) or "failed" (tried out)."""

        def once() -> httpx.Response:
            resp = client.post(str(sink.url), json=payload, timeout=sink.timeout_seconds)
            if resp.status_code >= 500 or resp.status_code == 429:
                raise SinkBusy(f"HTTP {resp.status_code}")
            return resp  # any other answer is final: 2xx sent, 4xx refused

        # backoff, 2*backoff, 4*backoff, ... between the tries (retries is at most 10: no cap
        # needed); no wait after the last try, and stop() ends a wait
        retry = Backoff(self.backoff, math.inf, jitter=0.0, tries=sink.retries + 1, stop=self._stop)
        try:
            resp = retry.call(once, (httpx.HTTPError, SinkBusy), lambda exc, _pause: self._warn(sink, exc))
        except (httpx.HTTPError, SinkBusy) as exc:
            self._warn(sink, exc)
            self._count(sink.kind, "failed")
            return "failed"
        outcome = "sent" if resp.is_success else "refused"
        self._count(sink.kind, outcome)
        return outcome

    @staticmethod
    def _warn(sink: NotifySink, exc: BaseException) -> None:
        log.warning("notify %s: %s", sink.kind, exc)


NO_SPARE_POOL = re.compile(r"\(pool ([A-Za-z0-9_.-]{1,63}|\?)\)")
MAX_NODES_LISTED = 50


def no_spare_pool(detail: str) -> str:
    """The pool named in a `no_spare` phase's detail ("no spare: ... (pool h100)"), or "?"."""
    m = NO_SPARE_POOL.search(detail)
    return m.group(1) if m else "?"


class SpareShortage:
    """One notification per pool whose hot spares ran out, not one page per node.

    In a storm every incident past the pool's spares completes "no spare: jobs wait for capacity"
    (the node is fenced, evacuated, drained and retired; its jobs wait for backfill). Their nodes
    are collected per pool and reported in one `pool.spares_exhausted` event with how many wait,
    sent when the storm's runs are over (`flush(busy=False)`) or `max_hold_seconds` after the
    first, whichever comes first, so the count is the storm's, not one run's. Later nodes of the
    same pool within `rearm_seconds` of that page are counted, not paged again.
    """

    def __init__(
        self,
        send: Callable[..., None],
        max_hold_seconds: float = 120.0,
        rearm_seconds: float = 3600.0,
    ) -> None:
        self._send = send
        self.max_hold_seconds = max_hold_seconds
        self.rearm_seconds = rearm_seconds
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[str, str]] = {}  # pool -> {node: incident}, not yet reported
        self._since: dict[str, float] = {}  # pool -> when its first unreported node came
        self._paged: dict[str, float] = {}  # pool -> when its last page went out
        self.quiet: dict[str, int] = {}  # pool -> nodes counted after its page (re-arm window)
        self._empty: set[str] = set()  # pools the spare keeper reported with no spare left

    def level(self, pool: str, spares: int, declared: int) -> bool:
        """The spare keeper's count of a pool (remediation/spares.py): one `pool.spares_exhausted`
        when a pool that declares spares has none, none more until it had one again. True: sent."""
        with self._lock:
            if spares > 0 or declared == 0:
                self._empty.discard(pool)
                return False
            if pool in self._empty:
                return False
            self._empty.add(pool)
        self._send(
            "pool.spares_exhausted",
            pool=pool,
            waiting=0,
            reason=f"no spare left in pool {pool} (0 of {declared} declared): a failure waits for capacity",
        )
        return True

    def add(self, pool: str, node: str, incident: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            if now - self._paged.get(pool, -1e18) < self.rearm_seconds:
                self.quiet[pool] = self.quiet.get(pool, 0) + 1
                return
            self._waiting.setdefault(pool, {})[node] = incident
            self._since.setdefault(pool, now)

    def flush(self, busy: bool, now: float | None = None) -> list[str]:
        """Send what is due: every pool when nothing is running any more (`busy` False), else the
        pools held past `max_hold_seconds`. Returns the pools reported."""
        now = time.time() if now is None else now
        with self._lock:
            due = [p for p in self._waiting if not busy or now - self._since[p] >= self.max_hold_seconds]
            out = [(p, self._waiting.pop(p)) for p in due]
            for p in due:
                self._since.pop(p, None)
                self._paged[p] = now
        for pool, nodes in out:
            names = sorted(nodes)
            self._send(
                "pool.spares_exhausted",
                pool=pool,
                waiting=len(names),
                nodes=names[:MAX_NODES_LISTED],
                incidents=[nodes[n] for n in names[:MAX_NODES_LISTED]],
                reason=f"no spare: {len(names)} node(s) of pool {pool} wait for capacity (backfill asked)",
            )
        return due
