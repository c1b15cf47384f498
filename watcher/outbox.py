"""The alerts waiting for Alertmanager: deduplicated, bounded, retried, and saved across restarts.

One entry per alert identity (its label set). A GPU printing thousands of lines a second makes one
entry whose occurrence count grows; it is posted once, then again only every `resend_seconds` while
it keeps happening (Alertmanager keeps it alive until `endsAt` = last occurrence + `hold_seconds`).
An entry that failed to post is retried with exponential backoff, never dropped: when Alertmanager
comes back, everything still pending goes out. The outbox is bounded (`max_pending` identities):
when full, finished entries (delivered, past their endsAt) make room; a new identity that still
finds no room is counted as an overflow, the one thing that is lost, and it shows in the metrics.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from autoheal.backoff import Backoff
from watcher.alerts import WatchAlert

Key = tuple[tuple[str, str], ...]


@dataclass
class Entry:
    alert: WatchAlert
    first_at: float
    last_at: float
    count: int = 1
    posted_at: float | None = None
    dirty: bool = True  # to be posted (new, changed after its resend interval, or a failed post)
    failures: int = 0
    next_try: float = 0.0

    def payload(self, hold_seconds: float) -> dict[str, Any]:
        """The entry as Alertmanager's v2 API takes it (times are RFC 3339, UTC)."""
        return {
            "labels": dict(self.alert.labels),
            "annotations": {**self.alert.annotations, "occurrences": str(self.count)},
            "startsAt": _rfc3339(self.first_at),
            "endsAt": _rfc3339(self.last_at + hold_seconds),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "labels": self.alert.labels,
            "annotations": self.alert.annotations,
            "at": self.alert.at,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "count": self.count,
            "posted_at": self.posted_at,
            "dirty": self.dirty,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Entry:
        alert = WatchAlert(
            {str(k): str(v) for k, v in raw["labels"].items()},
            {str(k): str(v) for k, v in raw["annotations"].items()},
            float(raw["at"]),
        )
        return cls(
            alert,
            float(raw["first_at"]),
            float(raw["last_at"]),
            int(raw["count"]),
            None if raw.get("posted_at") is None else float(raw["posted_at"]),
            bool(raw.get("dirty", True)),
        )


def _rfc3339(ts: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Outbox:
    def __init__(
        self,
        hold_seconds: float,
        resend_seconds: float,
        max_pending: int,
        retry_min: float = 0.2,
        retry_max: float = 10.0,
    ) -> None:
        self.hold = hold_seconds
        self.resend = resend_seconds
        self.max_pending = max_pending
        self.retry_min = retry_min
        self.retry_max = retry_max
        # each entry counts its own failures and keeps its next try; the delays are the core's
        # (no jitter, as before). The sender (watcher/daemon.py) does the waiting, at most 1 s at
        # a time between looks at its stop event.
        self._backoff = Backoff(retry_min, retry_max, jitter=0.0)
        self._entries: dict[Key, Entry] = {}
        self.cond = threading.Condition()
        self.overflow = 0
        self.changed = False  # since the last save

    # -- intake ----------------------------------------------------------------------------------
    def offer(self, alert: WatchAlert, now: float) -> str:
        """Take one occurrence; returns new | refresh | dedup | overflow."""
        with self.cond:
            e = self._entries.get(alert.key)
            if e is not None:
                e.count += 1
                e.last_at = max(e.last_at, alert.at)
                if not alert.secondary:  # the latest line's text and facts (154's action can change)
                    e.alert = WatchAlert(e.alert.labels, alert.annotations, e.alert.at)
                if not e.dirty and e.posted_at is not None and now - e.posted_at >= self.resend:
                    e.dirty = True
                    self.changed = True
                    self.cond.notify_all()
                    return "refresh"
                return "dedup"
            if len(self._entries) >= self.max_pending and not self._make_room(now):
                self.overflow += 1
                return "overflow"
            self._entries[alert.key] = Entry(alert, alert.at, alert.at)
            self.changed = True
            self.cond.notify_all()
            return "new"

    def _make_room(self, now: float) -> bool:
        done = [k for k, e in self._entries.items() if not e.dirty and e.last_at + self.hold < now]
        if not done:
            # next: the delivered entry whose endsAt is nearest (Alertmanager still has it)
            done = sorted(
                (k for k, e in self._entries.items() if not e.dirty), key=lambda k: self._entries[k].last_at
            )[:1]
        for k in done:
            del self._entries[k]
        return bool(done)

    # -- delivery --------------------------------------------------------------------------------
    def due(self, now: float, limit: int) -> list[Entry]:
        with self.cond:
            ready = [e for e in self._entries.values() if e.dirty and e.next_try <= now]
            ready.sort(key=lambda e: e.first_at)
            return ready[:limit]

    def next_due(self) -> float | None:
        """When the earliest waiting entry may be tried (None: nothing waits)."""
        with self.cond:
            tries = [e.next_try for e in self._entries.values() if e.dirty]
            return min(tries) if tries else None

    def delivered(self, entries: list[Entry], now: float) -> None:
        with self.cond:
            for e in entries:
                e.posted_at = now
                e.dirty = False
                e.failures = 0
                e.next_try = 0.0
            self.changed = True

    def failed(self, entries: list[Entry], now: float) -> float:
        """Back off these entries; returns the delay before the next try."""
        with self.cond:
            delay = self.retry_min
            for e in entries:
                e.failures += 1
                delay = self._backoff.delay(e.failures)
                e.next_try = now + delay
            return delay

    def expire(self, now: float) -> int:
        """Forget delivered entries past their endsAt (a later occurrence is a new alert)."""
        with self.cond:
            gone = [k for k, e in self._entries.items() if not e.dirty and e.last_at + self.hold < now]
            for k in gone:
                del self._entries[k]
            if gone:
                self.changed = True
            return len(gone)

    # -- inspection and persistence -----------------------------------------------------------------
    def pending(self) -> int:
        with self.cond:
            return sum(1 for e in self._entries.values() if e.dirty)

    def __len__(self) -> int:
        with self.cond:
            return len(self._entries)

    def dump(self) -> list[dict[str, Any]]:
        with self.cond:
            self.changed = False
            return [e.as_json() for e in self._entries.values()]

    def load(self, raws: list[dict[str, Any]]) -> int:
        """Restore saved entries (bad ones are skipped); returns how many still wait to be posted."""
        with self.cond:
            for raw in raws[: self.max_pending]:
                try:
                    e = Entry.from_json(raw)
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue
                self._entries[e.alert.key] = e
            return sum(1 for e in self._entries.values() if e.dirty)
