"""One backoff for every retry loop: delays that grow while a dependency keeps failing, jittered,
cut short by a stop, and only for the errors worth another try.

Two ways to use it (kopf's throttler and Alertmanager's notify retry stage are the models):

- `call(fn, retry_on)`: the whole retry loop. `fn` is tried until it returns; an error that
  `retry_on` accepts is tried again after the next delay, any other error is raised at once. It
  gives up (raising the last error) after `tries` calls, when the next wait would end past `within`
  seconds from the first try, or when `stop` is set, which also ends a wait in progress. It never
  waits after the last try. It keeps its count on the stack, so threads may share one Backoff.
- `failed()` / `succeeded()` / `wait()`: for a loop that runs forever (a worker tick, a watch)
  and only needs the delay after each failure in a row, reset by the next success.

Delays: base, 2*base, 4*base, ... up to `cap`; with `jitter` j each is drawn from
[(1 - j) * delay, delay], so replicas that failed together do not retry together.

The collection's modules run where the autoheal package is not installed: collections/gen_contract.py
copies this file unchanged into the collection's module_utils/backoff.py (a test fails while the
copy differs). Hence the standard library only, and Python 3.8 at run time.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class Backoff:
    """Exponential backoff with jitter, a stop event, and optional limits on tries and time."""

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        jitter: float = 0.5,
        tries: int | None = None,
        within: float | None = None,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if base < 0 or cap < 0:
            raise ValueError(f"backoff: base and cap are seconds, not negative (base={base}, cap={cap})")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError(f"backoff: jitter is a fraction of the delay, 0 to 1 (got {jitter})")
        if tries is not None and tries < 1:
            raise ValueError(f"backoff: tries must be at least 1 (got {tries})")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.tries = tries
        self.within = within
        self.stop = stop if stop is not None else threading.Event()
        self.clock = clock
        self.failures = 0  # failures in a row, for failed() / succeeded()
        self._rng = rng if rng is not None else random.Random()  # noqa: S311 - spacing, not secrets

    def delay(self, failures: int) -> float:
        """The wait after `failures` failures in a row (1 = the first), jitter drawn."""
        full = min(self.cap, self.base * 2.0 ** min(max(failures, 1) - 1, 64))
        return full - self.jitter * full * self._rng.random()

    # -- a loop that runs forever: count the failures in a row -----------------------------------
    def failed(self) -> float:
        """Record one more failure in a row; returns how long to wait before the next try."""
        self.failures += 1
        return self.delay(self.failures)

    def succeeded(self) -> None:
        """The dependency works again: the next failure starts from `base`."""
        self.failures = 0

    def wait(self, seconds: float) -> bool:
        """Sleep `seconds` unless stopped first; True when the whole wait passed (False: stopped)."""
        return not self.stop.wait(max(0.0, seconds))

    def cancel(self) -> None:
        """Stop: a wait in progress ends now, and call() tries nothing more."""
        self.stop.set()

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    # -- the whole retry loop --------------------------------------------------------------------
    def call(
        self,
        fn: Callable[[], T],
        retry_on: tuple[type[BaseException], ...] | Callable[[BaseException], bool],
        on_retry: Callable[[BaseException, float], None] | None = None,
    ) -> T:
        """`fn()`, tried again after a delay while it raises an error `retry_on` accepts (a tuple
        of classes, or a predicate). Raises the last error when out of tries, time or stopped;
        `on_retry(error, delay)` is told before each wait (to log or count it)."""
        started = self.clock()
        failures = 0
        while True:
            try:
                return fn()
            except BaseException as exc:
                worth = isinstance(exc, retry_on) if isinstance(retry_on, tuple) else retry_on(exc)
                if not worth or self.stop.is_set():
                    raise
                failures += 1
                if self.tries is not None and failures >= self.tries:
                    raise  # that was the last try: no wait after it
                pause = self.delay(failures)
                if self.within is not None and self.clock() + pause > started + self.within:
                    raise  # the next try would come after the time allowed
                if on_retry is not None:
                    on_retry(exc, pause)
                if not self.wait(pause):
                    raise
