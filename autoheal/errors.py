"""autoheal's own exception types, so callers can tell our failures from library ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


class AutohealError(Exception):
    """Base class of every error autoheal raises on purpose."""


class ConfigError(AutohealError):
    """A configuration file or value is wrong; the message names the file, key and fix."""


class ValidationError(AutohealError):
    """Untrusted input (an alert, a CLI argument) failed validation."""


class LabError(AutohealError):
    """A lab service failed: the message names the service, the cause and its log file."""


def field_errors(errors: Iterable[Mapping[str, Any]], root: str) -> str:
    """Pydantic's `exc.errors()` as one line, each with its field's dotted path
    (`faults.2.threshold: ...`); `root` names an error of the whole document."""
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in errors)
