"""Test-only crash points: the runner kills itself (SIGKILL, as `kill -9` would) at a named
journal boundary, so tests can prove that a crash *anywhere* loses nothing and repeats nothing.

Set AUTOHEAL_TEST_CRASH_AT to one point; unset (always, in production) it costs one dict lookup.
The points, in the order one incident meets them (tests/faults/test_crash.py):

  decided       the policy's decisions are committed (the incident is admitted), no run yet
  run_created   the run row is committed and the incident is running; the play is not started
  phase:<name>  the play's report that <name> finished is committed (the play keeps running,
                orphaned, as after a real crash)
  play_ended    the play has exited; its end is not yet recorded
  closed        the incident is closed in the journal; its notification is not yet sent
"""

from __future__ import annotations

import logging
import os
import signal

ENV = "AUTOHEAL_TEST_CRASH_AT"
log = logging.getLogger(__name__)


def crash_point(name: str) -> None:
    """Die here, at once and without cleanup, when AUTOHEAL_TEST_CRASH_AT names this point."""
    if os.environ.get(ENV) == name:
        log.critical("crash point %s reached: killing the runner (%s)", name, ENV)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
