"""autoheal's own exception types, so callers can tell our failures from library ones."""

from __future__ import annotations


class AutohealError(Exception):
    """Base class of every error autoheal raises on purpose."""


class ConfigError(AutohealError):
    """A configuration file or value is wrong; the message names the file, key and fix."""


class ValidationError(AutohealError):
    """Untrusted input (an alert, a CLI argument) failed validation."""


class LabError(AutohealError):
    """A lab service failed: the message names the service, the cause and its log file."""
