"""The review's results: each check's status, and the findings the Markdown summary shows.

A check has four outcomes, and only one of them is a pass: `passed`. A check that could not run
is `not run` and fails the review, unless the reviewer allowed it (`--allow-skip NAME`): then it
is `skipped`, still listed as skipped, never counted as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from review.plan import Plan
from review.stateful import Flag


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    NOT_RUN = "not run"
    SKIPPED = "skipped"


class CannotRun(Exception):
    """A check's tool, lab or input is missing; the message says what and how to get it."""


@dataclass(frozen=True)
class CheckResult:
    name: str  # what --allow-skip names: preview:<stack>, lint, monitoring, dryrun
    title: str
    status: Status
    detail: str


@dataclass(frozen=True)
class Violation:
    rule: str
    resource: str  # a URN, or "" for a stack-wide rule
    message: str
    level: str = "mandatory"


@dataclass
class StackPreview:
    stack: str
    why: list[str]  # the changed files that touch it
    how: str = ""  # "real engine against ..." / "mocks: ..."
    baseline: str = ""
    plan: Plan = field(default_factory=Plan)
    violations: list[Violation] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    not_run: str = ""  # why the preview could not run


@dataclass(frozen=True)
class LintFinding:
    rule: str
    path: str
    line: int
    message: str
    severity: str


@dataclass
class DryRunPlan:
    """What the runbook's check-mode run would do."""

    nodes: list[str]
    drained: list[str] = field(default_factory=list)  # Slurm DRAIN (fence)
    quarantined: list[str] = field(default_factory=list)  # Kubernetes cordon + taint + label
    promotions: list[tuple[str, str]] = field(default_factory=list)  # (failed node, spare)
    no_spare: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)  # nodes the Kubernetes drain empties
    retired: list[str] = field(default_factory=list)
    failed_task: str = ""


@dataclass
class Review:
    base: str = ""
    base_ref: str = ""
    checks: list[CheckResult] = field(default_factory=list)
    previews: list[StackPreview] = field(default_factory=list)
    lint: list[LintFinding] = field(default_factory=list)
    dryrun: DryRunPlan | None = None
    notes: list[str] = field(default_factory=list)

    def unapproved(self) -> list[tuple[str, Flag]]:
        return [(p.stack, f) for p in self.previews for f in p.flags if not f.approved]

    @property
    def passed(self) -> bool:
        ok = all(c.status in (Status.PASSED, Status.SKIPPED) for c in self.checks)
        return ok and not self.unapproved()
