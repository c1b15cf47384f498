"""The watcher daemon: three threads (four with a sysfs root) around one outbox.

- reader: source -> driver events -> alerts offered to the outbox; advances the cursor.
- sender: outbox -> Alertmanager, rate-limited (a token bucket of `rate_per_second`, `burst`),
  batches of up to `max_batch`, exponential backoff while Alertmanager is down.
- links: (with a sysfs root) every `link_poll_seconds` reads the node's ports and PCIe links
  (watcher/links.py) and offers a NodeDegraded alert for each degraded fault that holds; the
  reader hands it the kernel log's link lines (watcher/link_lines.py) as flaps.
- keeper: every 0.2 s saves the cursor and outbox when they changed; refreshes the GPU map;
  forgets delivered alerts past their endsAt; mirrors the counts into the metrics.

The reader offers an alert before it moves the cursor past its line, and the keeper saves both in
one file, so after a crash a line is either behind the saved cursor with its alert in the saved
outbox, or ahead of it and read again (Alertmanager merges a re-post of the same alert).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from autoheal.faults import FaultCatalog, load_fault_catalog
from autoheal.xid import XidCatalog, load_catalog
from autoheal.xid_messages import GpuAnnounce, SxidLine, XidLine, parse_message
from watcher import state
from watcher.alertmanager import AlertmanagerClient, PostError
from watcher.alerts import alert_for
from watcher.config import WatcherConfig
from watcher.gpus import GpuMap
from watcher.link_lines import parse_link_line
from watcher.links import LinkMonitor, degraded_alert
from watcher.metrics import WatcherMetrics, serve
from watcher.outbox import Outbox
from watcher.sources import Line, Source, open_source

log = logging.getLogger(__name__)
SAVE_EVERY_S = 0.2


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.at = time.monotonic()

    def take(self) -> float:
        """Take one token; returns how long to wait first (0 when one was there)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        self.tokens -= 1
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class Watcher:
    def __init__(
        self, cfg: WatcherConfig, catalog: XidCatalog | None = None, faults: FaultCatalog | None = None
    ) -> None:
        self.cfg = cfg
        self.catalog = catalog or load_catalog()
        self.faults = faults or load_fault_catalog()
        self.links = LinkMonitor(cfg.sysfs_root, self.faults) if cfg.sysfs_root else None
        self.metrics = WatcherMetrics()
        cursor, saved = state.load(cfg.state_file, cfg.node)
        self.cursor = cursor
        self.outbox = Outbox(
            cfg.alert_hold_seconds,
            cfg.resend_seconds,
            cfg.max_pending,
            cfg.retry_min_seconds,
            cfg.retry_max_seconds,
        )
        restored = self.outbox.load(saved)
        if restored:
            log.info("restored %d undelivered alert(s) from %s", restored, cfg.state_file)
        self.gpus = GpuMap(cfg.gpu_map)
        self.metrics.gpus.set(self.gpus.refresh())
        self.source: Source = open_source(
            cfg.source,
            cfg.path,
            cursor,
            boot_id_file=cfg.boot_id_file,
            replay_seconds=cfg.replay_seconds,
            poll_seconds=cfg.poll_seconds,
            journalctl=cfg.journalctl,
        )
        self.client = AlertmanagerClient(
            [str(u) for u in cfg.alertmanagers], cfg.token_file, cfg.post_timeout_seconds
        )
        self.limiter = TokenBucket(cfg.rate_per_second, cfg.burst)
        self.stop_event = threading.Event()
        self._cursor_dirty = False
        self._threads: list[threading.Thread] = []
        self._server: Any = None

    # -- reading ---------------------------------------------------------------------------------
    def handle(self, line: Line) -> None:
        """One kernel message: learn GPU UUIDs, offer alerts, count what was seen."""
        at = line.wall_time or time.time()
        if self.links is not None and (link := parse_link_line(line.message)) is not None:
            self.links.kernel_event(link, at, time.time())  # a flap, counted by the link check
            self.metrics.events.labels(kind="link", code=link.what).inc()
            return
        for event in parse_message(line.message):
            if isinstance(event, GpuAnnounce):
                self.gpus.learn_uuid(event.bus_id, event.uuid)
                self.metrics.events.labels(kind="gpu_announce", code="").inc()
                continue
            kind, code = (
                ("xid", str(event.xid))
                if isinstance(event, XidLine)
                else ("sxid", str(event.sxid))
                if isinstance(event, SxidLine)
                else ("fallen_off_bus", "79")
            )
            self.metrics.events.labels(kind=kind, code=code).inc()
            self.metrics.last_event.set(time.time())
            if kind != "sxid" and self.gpus.get(event.bus_id) is None:
                self.gpus.refresh_soon()  # this alert goes out without a GPU index; later ones have it
            alert = alert_for(event, self.cfg.node, self.gpus, self.catalog, at, line.message)
            if alert is not None:
                self.metrics.offered.labels(outcome=self.outbox.offer(alert, time.time())).inc()

    def _read(self) -> None:
        for line in self.source.lines(self.stop_event):
            try:
                self.handle(line)
            except Exception:  # one bad line must never stop detection
                log.exception("could not handle a kernel log line")
            self.cursor = line.cursor
            self._cursor_dirty = True

    def poll_links(self, now: float) -> int:
        """One look at the node's links; returns how many alerts were offered."""
        if self.links is None:
            return 0
        offered = 0
        for finding in self.links.poll(now):
            self.metrics.events.labels(kind="degraded", code=finding.fault.value).inc()
            alert = degraded_alert(self.cfg.node, finding, self.faults, now)
            if alert is not None:
                self.metrics.offered.labels(outcome=self.outbox.offer(alert, now)).inc()
                offered += 1
        return offered

    def _watch_links(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.poll_links(time.time())
            except Exception:  # a strange sysfs must never stop the watcher
                log.exception("could not read the node's links")
            self.stop_event.wait(self.cfg.link_poll_seconds)

    # -- sending ---------------------------------------------------------------------------------
    def _send(self) -> None:
        ob = self.outbox
        while not self.stop_event.is_set():
            with ob.cond:
                batch = ob.due(time.time(), self.cfg.max_batch)
                if not batch:
                    nd = ob.next_due()
                    ob.cond.wait(1.0 if nd is None else min(1.0, max(0.01, nd - time.time())))
                    continue
            wait = self.limiter.take()
            if wait > 0 and self.stop_event.wait(wait):
                return
            self.send_batch(batch)

    def send_batch(self, batch: list[Any]) -> bool:
        try:
            self.client.post([e.payload(self.cfg.alert_hold_seconds) for e in batch])
        except (PostError, OSError) as exc:
            delay = self.outbox.failed(batch, time.time())
            self.metrics.post_errors.inc()
            self.metrics.am_up.set(0)
            log.warning("%d alert(s) not delivered, retrying in %.1fs: %s", len(batch), delay, exc)
            return False
        self.outbox.delivered(batch, time.time())
        self.metrics.posts.inc()
        self.metrics.posted.inc(len(batch))
        self.metrics.am_up.set(1)
        return True

    # -- housekeeping ----------------------------------------------------------------------------
    def save(self) -> None:
        if self._cursor_dirty or self.outbox.changed:
            self._cursor_dirty = False
            state.save(self.cfg.state_file, self.cfg.node, self.cursor, self.outbox.dump())

    def _keep(self) -> None:
        last_refresh = time.monotonic()
        while not self.stop_event.wait(SAVE_EVERY_S):
            try:
                self.save()
                self.outbox.expire(time.time())
                if time.monotonic() - last_refresh >= self.cfg.gpu_refresh_seconds:
                    last_refresh = time.monotonic()
                    threading.Thread(target=self._refresh_gpus, daemon=True).start()
                self._mirror()
            except Exception:
                log.exception("watcher housekeeping failed")

    def _refresh_gpus(self) -> None:
        self.metrics.gpus.set(self.gpus.refresh())

    def _mirror(self) -> None:
        st = self.source.stats
        m = self.metrics
        m.records.set(st.records)
        m.skipped.set(st.skipped)
        m.lost.set(st.lost)
        m.garbage.set(st.garbage)
        m.source_up.set(1 if st.up else 0)
        m.pending.set(self.outbox.pending())
        m.gpus.set(len(self.gpus))

    def health(self) -> dict[str, Any]:
        alive = {t.name: t.is_alive() for t in self._threads}
        return {
            "ok": bool(alive) and all(alive.values()),
            "threads": alive,
            "source_up": self.source.stats.up,
            "source_errors": self.source.stats.errors[-3:],
            "pending": self.outbox.pending(),
            "gpus": len(self.gpus),
        }

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Watcher:
        if self.cfg.listen:
            host, _, port = self.cfg.listen.rpartition(":")
            self._server = serve(self.metrics, host, int(port), self.health)
        targets = [("reader", self._read), ("sender", self._send), ("keeper", self._keep)]
        if self.links is not None:
            targets.append(("links", self._watch_links))
        for name, target in targets:
            t = threading.Thread(target=target, name=f"watcher-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "watching %s (%s) on node %s: %d GPU(s) known (%s), posting to %s",
            self.cfg.path or self.cfg.source,
            self.cfg.source,
            self.cfg.node,
            len(self.gpus),
            self.gpus.how,
            ", ".join(str(u) for u in self.cfg.alertmanagers),
        )
        return self

    def stop(self) -> None:
        self.stop_event.set()
        with self.outbox.cond:
            self.outbox.cond.notify_all()
        for t in self._threads:
            t.join(5)
        self.save()
        self.client.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def run_forever(self) -> None:
        self.start()
        try:
            while not self.stop_event.wait(1.0):
                dead = [t.name for t in self._threads if not t.is_alive()]
                if dead:  # exit non-zero: the DaemonSet restarts us, from the saved state
                    raise RuntimeError(f"watcher thread(s) died: {', '.join(dead)}")
        finally:
            self.stop()
