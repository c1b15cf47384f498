"""The pool backend interface: reboot, retire and health, each for a batch of nodes.

A backend acts on *instances*, found from a node's Kubernetes `spec.providerID` (never from alert
text), and keeps the pool's declared size: a retired instance is replaced by the pool's own
machinery (an autoscaling group, a NodePool, the lab's pool controller), which brings the new
node up as a spare. Rules every backend follows (roles/node_pool/README.md):

- idempotent: the provider's state is read first; a node already retired is not retired again
  and its result says `changed=False`; a retire retried after a crash never terminates twice and
  never the wrong instance (the instance is checked against the node's own providerID);
- batch-aware: one call per batch where the API takes one, else concurrent calls;
- a failure of one node is a result (`ok=False`, `detail` says why), not an exception; an error that
  stops the whole batch (no credentials, API unreachable after retries) raises BackendError
  naming what to fix (for AWS, the missing IAM action).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from autoheal.errors import AutohealError


class BackendError(AutohealError):
    """The backend could not act on the batch at all (credentials, permissions, API down)."""


@dataclass(frozen=True)
class NodeResult:
    """What one operation did to one node."""

    node: str
    ok: bool
    changed: bool = False
    detail: str = ""
    # the provider's handle of the node's machine (an instance id, a NodeClaim name)
    instance: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PoolHealth:
    """What a backend sees of one pool: its machines and whether it can act on them."""

    pool: str
    backend: str
    ok: bool
    detail: str = ""
    # counts the provider reports (desired, in service, pending, terminating...)
    counts: dict[str, int] = field(default_factory=dict)
    # nodes (by Kubernetes name) the provider knows as members of the pool
    members: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class PoolBackend(Protocol):
    """One implementation per infrastructure; pools/registry.py finds them by name."""

    name: str

    def reboot(self, nodes: Sequence[str], timeout: float) -> list[NodeResult]:
        """Reboot the nodes' machines; ok once each node is Ready again after a new boot (a new
        boot id), within `timeout` seconds. A backend that cannot reboot answers ok=False, with
        why, for every node (the ladder then escalates to retire)."""
        ...

    def retire(self, nodes: Sequence[str]) -> list[NodeResult]:
        """Terminate the nodes' machines so that the pool replaces them (its declared size kept)."""
        ...

    def health(self, pools: Sequence[str]) -> list[PoolHealth]:
        """Read-only: what the provider reports of the named pools (all when empty)."""
        ...
