"""The runner's backoff is the core's (autoheal/backoff.py): one primitive for every retry loop.

Kept so `from remediation.backoff import Backoff` (the worker's tick loop) goes on working.
"""

from __future__ import annotations

from autoheal.backoff import Backoff

__all__ = ["Backoff"]
