"""The leader's fleet loops (the spare keeper, the dead-node cleanup): one reconcile every
`interval` seconds while this replica leads, a failing pass retried on the one backoff
(autoheal/backoff.py), the loop outliving a broken API server or slurmctld."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import ClassVar

from autoheal.backoff import Backoff

log = logging.getLogger(__name__)


class LeaderLoop:
    """Mixed into a dataclass that has `interval`, `leading`, `last_error`, `_stop`, `_thread`
    and a `reconcile()`; `name` names the loop in logs and its thread."""

    name: ClassVar[str]
    interval: float
    leading: Callable[[], bool]
    last_error: str | None
    _stop: threading.Event
    _thread: threading.Thread | None

    def reconcile(self) -> object:
        raise NotImplementedError

    def following(self) -> None:
        """Each pass while another replica leads (a loop drops state that would be stale)."""

    def _loop(self) -> None:
        retry = Backoff(base=1.0, cap=max(self.interval, 1.0), jitter=0.0, stop=self._stop)
        while not self._stop.is_set():
            pause = self.interval
            if self.leading():
                try:
                    self.reconcile()
                    self.last_error = None
                    retry.succeeded()
                except Exception as exc:  # the loop outlives a broken API server or slurmctld
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    pause = retry.failed()
                    log.warning("%s: %s (retrying in %.0f s)", self.name, self.last_error, pause)
            else:
                self.following()
            retry.wait(pause)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name.replace(" ", "-"), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
