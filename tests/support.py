"""Helpers every test package shares: one `wait_for`, and port blocks that can be shifted.

`AUTOHEAL_TEST_PORT_OFFSET` moves every fixed port block the suites use, so two checkouts can run
their lab tests on one machine at the same time without fighting over loopback ports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

PORT_OFFSET = int(os.environ.get("AUTOHEAL_TEST_PORT_OFFSET", "0"))


def port_base(base: int) -> int:
    """`base` shifted by $AUTOHEAL_TEST_PORT_OFFSET."""
    return base + PORT_OFFSET


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, what: str = "condition", interval: float = 0.2) -> Any:
    """Poll `pred` until it returns something truthy (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
