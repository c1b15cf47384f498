"""What the preflight reads and reports: the cluster as the API returned it, a check's row,
the report, and the status words a row carries."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "info", "warn", "fail"]

MONITORING_GROUP = "monitoring.coreos.com"


@dataclass(frozen=True)
class Check:
    """One row of the report: `fix` says what to do when the status is warn or fail."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass
class Report:
    stack: str
    server: str
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "server": self.server,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "checks": [asdict(c) for c in self.checks],
        }

    def text(self, only: Iterable[Status] | None = None) -> str:
        """Plain text (the Pulumi program's error): one paragraph per check shown."""
        want = set(only) if only is not None else None
        lines = []
        for c in self.checks:
            if want is not None and c.status not in want:
                continue
            lines.append(f"[{c.status.upper()}] {c.name}: {c.detail}")
            if c.fix and c.status in ("warn", "fail"):
                lines.append(f"    fix: {c.fix}")
        return "\n".join(lines)


@dataclass
class ClusterView:
    """What the checks read from the API: plain JSON objects as the API server returned them.
    `None` for a list means it could not be read (`denied` names why)."""

    version: dict[str, Any]
    nodes: list[dict[str, Any]]
    storage_classes: list[dict[str, Any]] | None
    crds: set[str] | None  # names of CustomResourceDefinitions of MONITORING_GROUP
    prometheuses: list[dict[str, Any]] | None = None
    alertmanagers: list[dict[str, Any]] | None = None
    namespace: dict[str, Any] | None = None  # the stack's namespace, when it exists
    cgroup_v1_nodes: set[str] | None = None  # nodes whose kubelet posted a CgroupV1 event
    denied: dict[str, str] = field(default_factory=dict)

    def unlisted(self, row: str, kind: str, resource: str, api: str, fix: str) -> Check:
        """The failed row of a check whose list was refused (`denied`) or is not served."""
        why = self.denied.get(resource, f"the {api} API is not served")
        return Check(row, "fail", f"cannot list {kind} ({why})", fix)
