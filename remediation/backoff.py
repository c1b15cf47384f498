"""Backoff for retrying a dependency that is down: delays that grow while it keeps failing and
reset after it works again (kopf's throttler does the same for operator handlers).

The worker loop uses it so a journal on a full disk, or any error that repeats every tick, is not
retried a few times a second (filling the log and spinning a core) but at a growing interval,
capped so the runner notices the recovery within `cap` seconds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Exponential backoff with jitter: base, 2*base, 4*base, ... up to `cap`, each delay drawn
    in [delay/2, delay] so replicas that failed together do not retry together."""

    base: float
    cap: float
    failures: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def failed(self) -> float:
        """Record one more failure in a row; returns how long to wait before the next try."""
        self.failures += 1
        delay: float = min(self.cap, self.base * 2.0 ** min(self.failures - 1, 32))
        return delay / 2 + self._rng.random() * delay / 2

    def succeeded(self) -> None:
        """The dependency works again: the next failure starts from `base`."""
        self.failures = 0
