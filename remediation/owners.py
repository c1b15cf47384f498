"""Job owners: who to tell (the owner directory), what to tell them (one message per owner), and
when (a storm's news held a few seconds so that an owner of a hundred jobs gets one message).

An owner is the Slurm user of a job an incident touched. Their contact comes from the directory
file (`owners.directory`: user -> {email: ...} or {slack: U...}), else from the job's MailUser
(`sbatch --mail-user`, when `owners.mail_user`), else there is none and on-call is told whose job
it is, once. Messages carry typed facts only (job ids, node names, steps, seconds), never alert
text. The loop that finds the news, sends it and journals it is remediation/owner_loop.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autoheal.yamlfile import read_yaml
from remediation.errors import RunnerConfigError

NoticeKind = Literal["hit", "resumed", "waiting"]
KINDS: tuple[NoticeKind, ...] = ("hit", "resumed", "waiting")
EMAIL = re.compile(r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}$")
SLACK_ID = re.compile(r"^[UW][A-Z0-9]{2,20}$")
SLURM_USER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_JOBS_LISTED = 50  # an owner of more jobs gets the count and the first this many
MAX_NODES_LISTED = 10  # likewise for the nodes that failed under them


@dataclass(frozen=True)
class Contact:
    kind: Literal["email", "slack"]
    address: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.address}"


def parse_contact(value: Any, where: str) -> Contact:
    """{email: a@b.c} or {slack: U123ABC}; a clear error naming the entry otherwise."""
    if isinstance(value, dict) and len(value) == 1:
        ((kind, address),) = value.items()
        if kind == "email" and isinstance(address, str) and EMAIL.fullmatch(address):
            return Contact("email", address)
        if kind == "slack" and isinstance(address, str) and SLACK_ID.fullmatch(address):
            return Contact("slack", address)
    raise RunnerConfigError(
        f"{where}: a contact is {{email: name@example.org}} or {{slack: U0123ABCD}} (a Slack user id);"
        f" got {str(value)[:100]!r}"
    )


class OwnerDirectory:
    """Slurm user -> contact: the directory's entry, else the job's MailUser, else None."""

    def __init__(self, entries: Mapping[str, Contact] | None = None, mail_user: bool = True) -> None:
        self.entries = dict(entries or {})
        self.mail_user = mail_user

    @classmethod
    def load(cls, path: Path | None, mail_user: bool = True) -> OwnerDirectory:
        if path is None:
            return cls({}, mail_user)
        data = read_yaml(path, "the owner directory", RunnerConfigError) or {}
        if not isinstance(data, dict):
            raise RunnerConfigError(f"{path}: the owner directory maps Slurm users to contacts")
        entries = {}
        for user, value in data.items():
            if not isinstance(user, str) or not SLURM_USER.fullmatch(user):
                raise RunnerConfigError(f"{path}: {str(user)[:70]!r} is not a Slurm user name")
            entries[user] = parse_contact(value, f"{path}: {user}")
        return cls(entries, mail_user)

    def contact(self, user: str, mail_user: str = "") -> Contact | None:
        if user in self.entries:
            return self.entries[user]
        if self.mail_user and EMAIL.fullmatch(mail_user):
            return Contact("email", mail_user)
        return None


@dataclass(frozen=True)
class Notice:
    """One piece of news about one job of one incident; (incident, job, kind) is sent once."""

    incident: str
    job: int
    kind: NoticeKind
    user: str
    at: float  # when the news became known (the requeue, the resume, the wait)
    node: str = ""  # the faulty node (hit)
    fault: str = ""  # what failed, in the catalogue's words (hit)
    nodes: str = ""  # where the job runs again (resumed)
    ckpt_step: int | None = None  # the checkpoint step it resumed from (resumed)
    down_s: float | None = None  # fault -> first step after resume (resumed)

    @property
    def key(self) -> str:
        return f"{self.kind} job {self.job}"


def _jobs(ids: Iterable[int]) -> str:
    ids = sorted(set(ids))
    shown = ", ".join(str(i) for i in ids[:MAX_JOBS_LISTED])
    return shown + (f" and {len(ids) - MAX_JOBS_LISTED} more" if len(ids) > MAX_JOBS_LISTED else "")


def owner_text(user: str, notices: list[Notice]) -> str:
    """The one message an owner gets for a batch of news, a paragraph per kind."""
    parts: list[str] = []
    hits = [n for n in notices if n.kind == "hit"]
    if hits:
        by_fault: dict[tuple[str, str], list[int]] = {}
        for n in hits:
            by_fault.setdefault((n.fault or "a hardware fault", n.node), []).append(n.job)
        lines = [f"{what} on {node}: job(s) {_jobs(jobs)}" for (what, node), jobs in sorted(by_fault.items())]
        if len(lines) > MAX_NODES_LISTED:
            nodes = sorted({n.node for n in hits})
            lines = [
                f"{len(nodes)} nodes failed ({', '.join(nodes[:MAX_NODES_LISTED])}"
                f" and {len(nodes) - MAX_NODES_LISTED} more)"
            ]
        parts.append(
            f"Your job(s) {_jobs(n.job for n in hits)} were hit by a hardware fault and requeued: "
            + "; ".join(lines)
            + ". autoheal fenced the node(s) and will restart them from their last checkpoint;"
            " nothing is asked of you."
        )
    for n in sorted((n for n in notices if n.kind == "resumed"), key=lambda n: n.job)[:MAX_JOBS_LISTED]:
        step = "its last checkpoint" if n.ckpt_step is None else f"checkpoint step {n.ckpt_step}"
        down = "" if n.down_s is None else f", down {n.down_s:.0f} s"
        parts.append(f"Job {n.job} runs again on {n.nodes or '?'} from {step}{down}.")
    resumed = [n for n in notices if n.kind == "resumed"]
    if len(resumed) > MAX_JOBS_LISTED:
        parts.append(f"({len(resumed) - MAX_JOBS_LISTED} more job(s) run again.)")
    waiting = [n.job for n in notices if n.kind == "waiting"]
    if waiting:
        parts.append(
            f"Job(s) {_jobs(waiting)} wait for capacity (no spare node was left); they start by"
            " themselves when nodes free up. Nothing is asked of you."
        )
    return f"Hello {user}: " + " ".join(parts)


@dataclass
class Batcher:
    """Holds each owner's news while a storm still brings more: an owner's batch is due once no
    news came for `quiet_seconds`, or `max_hold_seconds` after its first, whichever is first."""

    quiet_seconds: float = 3.0
    max_hold_seconds: float = 60.0
    _first_seen: dict[str, float] = field(default_factory=dict)  # user -> when we first held news

    def due(self, notices: Iterable[Notice], now: float) -> dict[str, list[Notice]]:
        by_user: dict[str, list[Notice]] = {}
        for n in notices:
            by_user.setdefault(n.user, []).append(n)
        out: dict[str, list[Notice]] = {}
        for user, news in by_user.items():
            first = self._first_seen.setdefault(user, now)
            newest = max(n.at for n in news)
            if now - newest >= self.quiet_seconds or now - first >= self.max_hold_seconds:
                out[user] = sorted(news, key=lambda n: (n.kind, n.job, n.incident))
        for user in list(self._first_seen):
            if user not in by_user or user in out:
                del self._first_seen[user]
        return out
