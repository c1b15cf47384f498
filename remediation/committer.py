"""Group commit: many webhook deliveries share one durable SQLite commit.

A commit with synchronous=FULL costs an fsync (~4 ms here), which would cap the webhook near
250 deliveries/s. One writer thread takes every delivery waiting in its queue, writes each in its
own savepoint of a single transaction, commits once, and only then answers each waiting request.
So the rule "nothing acknowledged before it is on disk" holds per delivery, a failing delivery
rolls back alone, and under load the fsync is shared by the whole group.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from remediation.errors import JournalError
from remediation.incidents import DeliveryResult, Intake, Routed
from remediation.journal import Journal

log = logging.getLogger(__name__)
_Item = tuple[list[Routed], "Future[DeliveryResult]"]


class GroupCommitter:
    def __init__(self, journal: Journal, intake: Intake, max_group: int = 256) -> None:
        self.journal = journal
        self.intake = intake
        self.max_group = max_group
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="autoheal-commit", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join(timeout)

    def submit(self, routed: list[Routed]) -> Future[DeliveryResult]:
        """Queue a routed delivery; the future resolves after its commit (or fails: JournalError)."""
        self.start()
        fut: Future[DeliveryResult] = Future()
        self._queue.put((routed, fut))
        return fut

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < self.max_group:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                group.append(item)
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[_Item]) -> None:
        results: list[tuple[Future[DeliveryResult], DeliveryResult | BaseException]] = []
        try:
            with self.journal.transaction() as tx:
                for routed, fut in group:
                    try:
                        with tx.savepoint():
                            results.append((fut, self.intake.apply(tx, routed)))
                    except Exception as exc:
                        log.exception("delivery failed; rolled back alone")
                        results.append((fut, JournalError(f"delivery not recorded: {exc}")))
        except Exception as exc:
            err = exc if isinstance(exc, JournalError) else JournalError(str(exc))
            for _, fut in group:
                fut.set_exception(err)
            return
        for fut, outcome in results:
            if isinstance(outcome, BaseException):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)
