"""The runner's own exception types, so the webhook and worker can map failures to replies.

Each type derives from autoheal's base classes: a payload problem is a ValidationError (the
sender's fault: 4xx, never retried), a journal problem is a RemediationError (ours: 5xx, retried).
"""

from __future__ import annotations

from autoheal.errors import AutohealError, ConfigError, ValidationError


class RemediationError(AutohealError):
    """Base class of every error the remediation runner raises on purpose."""


class PayloadError(ValidationError):
    """A webhook body is malformed, oversized or hostile; nothing of it was recorded."""


class AuthError(RemediationError):
    """A request did not carry the runner's bearer token."""


class JournalError(RemediationError):
    """The journal (SQLite or PostgreSQL) could not record or read something."""


class RulesError(ConfigError):
    """A routing rules file is invalid; the message names the file, the rule and the key."""


class RunnerConfigError(ConfigError):
    """The runner's own configuration (YAML or environment) is invalid."""


class ExecutionError(RemediationError):
    """A playbook could not be started or its inputs failed validation."""


class NodeBusyError(ExecutionError):
    """Another run (in this or another process) holds the per-node lock."""


class KubeError(RemediationError):
    """The Kubernetes API could not be read for labels or pool membership."""


class IllegalTransition(JournalError):
    """An incident state change the state machine does not allow (remediation/states.py)."""


class NotLeader(JournalError):
    """A write of a replica that no longer leads (its fencing token is stale); nothing written."""


class IllegalMark(RemediationError):
    """A move of the worker's in-flight marks that their table does not allow (remediation/inflight.py)."""
