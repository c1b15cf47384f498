"""The owner loop: tells each job's owner what a fault did to it, and journals what it cost.

Every `owners.interval_seconds` while this replica leads, it reads the journal's recent incidents:
the jobs each requeued (the play's `requeued` report: "requeued 12,13"), and what was already told
(`owner_notified` timeline entries, one per (incident, job, kind)). From Slurm it learns each job's
owner and whether it runs again. The news:

- hit: the job was requeued (what failed, where; nothing is asked of the owner);
- resumed: it runs again (where, from which checkpoint step, how long it was down); its cost is
  journalled (`job_cost`) and counted (autoheal_gpu_hours_lost_total);
- waiting: it still waits for capacity after its incident closed (no spare was left).

An owner's news is batched (remediation/owners.py: one message per owner in a storm) and sent to
the owner sink in this loop's own thread through the notify pipeline's retry stage, never in the
runbook's. It is journalled once sent, so a restart sends nothing twice; a sink that is down
leaves it pending: the loop backs off (autoheal/backoff.py, via remediation/fleetloop.py) and
tries again. An owner with no contact: on-call is told once, whose jobs they are.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import httpx

from remediation.closing import NO_SPARE_REASON
from remediation.config import OwnerSettings, RunnerConfig
from remediation.cost import (
    COST_PHASE,
    JobCost,
    costs_from,
    effective_training_time,
    job_cost,
    lost_in_window,
    read_progress,
)
from remediation.fleetloop import LeaderLoop
from remediation.journal import IncidentRecord, Journal, TimelineEntry
from remediation.metrics import Metrics
from remediation.notify import Notifier
from remediation.owners import Batcher, Contact, Notice, OwnerDirectory, owner_text
from remediation.slurm_jobs import JobInfo, JobSource, SlurmJobs, read_progress_file

log = logging.getLogger(__name__)
NOTICE_PHASE = "owner_notified"
REQUEUED = re.compile(r"requeued ([0-9,]+)")  # a prefix: match() anchors the start
NO_CONTACT = "on-call (no contact)"


class SinkDown(Exception):
    """The owner sink did not take a message after its retries: the rest waits for the next pass."""


@dataclass
class Hit:
    """One job one incident requeued, with what the journal says was told and what it cost."""

    incident: IncidentRecord
    job: int
    requeued_at: float
    fault_ts: float
    told: set[str]  # notice keys already sent ("hit job 12")
    cost: JobCost | None


def requeued_jobs(timeline: list[TimelineEntry]) -> dict[int, float]:
    """job id -> when the play reported it requeued."""
    out: dict[int, float] = {}
    for e in timeline:
        m = REQUEUED.match(e.detail) if e.phase == "requeued" and e.source == "play" else None
        for part in m.group(1).split(",") if m else ():
            if part.isdigit():
                out.setdefault(int(part), e.ts)
    return out


def fault_text(inc: IncidentRecord) -> str:
    gpu = "" if inc.gpu is None else f" on GPU {inc.gpu}"
    return f"XID {inc.xid} ({inc.fault_class}){gpu}"


@dataclass
class OwnerLoop(LeaderLoop):
    name: ClassVar[str] = "owner loop"
    settings: OwnerSettings
    journal: Journal
    metrics: Metrics
    notifier: Notifier
    slurm: JobSource
    directory: OwnerDirectory
    pool_of: Callable[[Collection[str]], dict[str, str]]
    leading: Callable[[], bool] = lambda: True
    clock: Callable[[], float] = time.time
    interval: float = 5.0
    last_error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _batcher: Batcher = field(default_factory=Batcher)
    _settled: dict[str, list[JobCost]] = field(default_factory=dict)  # incident -> costs, all told
    _pools: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.interval = self.settings.interval_seconds
        self._batcher = Batcher(self.settings.quiet_seconds, self.settings.max_hold_seconds)

    # one pass ---------------------------------------------------------------------------------
    def reconcile(self) -> int:
        """Find the news, record the costs, send what is due; the messages sent."""
        now = self.clock()
        hits = self._hits(now)
        infos = self.slurm.jobs({h.job for h in hits}) if hits else {}
        notices = [n for h in hits for n in self._news(h, infos.get(h.job), now)]
        sent = self._send(self._batcher.due(notices, now), infos)
        self._effective_training(hits, now)
        return sent

    def _hits(self, now: float) -> list[Hit]:
        """The jobs of recent incidents with something left to tell."""
        out: list[Hit] = []
        for inc in self.journal.incidents():
            if inc.opened_at < now - self.settings.lookback_seconds or inc.id in self._settled:
                continue
            timeline = self.journal.timeline(inc.id)
            jobs = requeued_jobs(timeline)
            if not jobs:
                if inc.closed_at is not None:
                    self._settled[inc.id] = []
                continue
            told = {e.detail.split(" -> ")[0].rsplit(" ", 1)[0] for e in timeline if e.phase == NOTICE_PHASE}
            costs = {c.job: c for c in costs_from(timeline)}
            if inc.closed_at is not None and all(f"resumed job {j}" in told for j in jobs):
                self._settled[inc.id] = list(costs.values())
                continue
            fault = self._fault_ts(inc)
            out += [Hit(inc, j, at, fault, told, costs.get(j)) for j, at in sorted(jobs.items())]
        return out

    def _fault_ts(self, inc: IncidentRecord) -> float:
        """When the fault fired: its first alert's startsAt (never after the incident opened)."""
        starts = [float(a["starts_at"]) for a in self.journal.alerts(inc.id) if a.get("starts_at")]
        return min([*starts, inc.opened_at])

    def _news(self, h: Hit, info: JobInfo | None, now: float) -> list[Notice]:
        user = info.user if info is not None else "?"
        hit = Notice(
            h.incident.id, h.job, "hit", user, h.requeued_at, h.incident.node, fault_text(h.incident)
        )
        if hit.key not in h.told:
            return [hit]
        if f"resumed job {h.job}" in h.told or info is None:
            return []
        if info.state == "RUNNING" and info.start_ts is not None and info.start_ts >= h.fault_ts - 1:
            cost = h.cost or self._cost(h, info, now)
            if cost is None:
                return []  # its first step is not there yet
            return [
                replace(
                    hit,
                    kind="resumed",
                    at=cost.resumed_ts,
                    nodes=info.nodes,
                    ckpt_step=cost.ckpt_step,
                    down_s=cost.down_s,
                )
            ]
        closed = h.incident.closed_at
        if (
            info.state == "PENDING"
            and closed is not None
            and f"waiting job {h.job}" not in h.told
            and (
                h.incident.reason.startswith(NO_SPARE_REASON)
                or now - closed >= self.settings.first_step_wait_seconds
            )
        ):
            return [replace(hit, kind="waiting", at=closed)]
        return []

    def _cost(self, h: Hit, info: JobInfo, now: float) -> JobCost | None:
        """The job's cost once it runs again (journalled and counted once); None while its first
        step after the resume is still awaited."""
        assert info.start_ts is not None
        events = read_progress_file(info.progress_path, self.settings.progress_roots)
        progress = read_progress(events, h.fault_ts) if events is not None else None
        waited = now - info.start_ts
        if (
            progress is not None
            and progress.resumed_ts is None
            and waited < self.settings.first_step_wait_seconds
        ):
            return None
        try:
            pool = self.pool_of([h.incident.node]).get(h.incident.node) or info.partition or "?"
        except Exception as exc:  # the API server is down: the job's partition names the pool
            log.warning("owner loop: pool of %s: %s", h.incident.node, exc)
            pool = info.partition or "?"
        cost = job_cost(h.job, info.gpus, h.fault_ts, info.start_ts, progress, pool)
        with self.journal.transaction() as tx:
            tx.timeline(h.incident.id, COST_PHASE, "ok", source="runner", detail=json.dumps(cost.as_dict()))
        h.cost = cost
        self.metrics.gpu_hours_lost.labels(pool=pool, fault_class=h.incident.fault_class).inc(cost.gpu_hours)
        self.metrics.job_resumed.observe(cost.down_s)
        log.info("incident %s: %s", h.incident.id, cost.line())
        return cost

    # sending ----------------------------------------------------------------------------------
    def _send(self, due: dict[str, list[Notice]], infos: dict[int, JobInfo]) -> int:
        sent = 0
        unknown: list[Notice] = []
        for user, news in sorted(due.items()):
            mail = next((infos[n.job].mail_user for n in news if n.job in infos), "")
            contact = self.directory.contact(user, mail) if user != "?" else None
            if contact is None:
                unknown += news
                continue
            if self.settings.sink is None:
                continue
            outcome = self._post(user, contact, news)
            if outcome == "failed":
                raise SinkDown(f"owner sink: {len(due) - sent} owner(s) wait (user {user} first)")
            self._record(news, f"{contact}" + ("" if outcome == "sent" else " (refused)"))
            sent += 1
        if unknown:
            self._tell_on_call(unknown)
        return sent

    def _post(self, user: str, contact: Contact, news: list[Notice]) -> str:
        assert self.settings.sink is not None
        text = owner_text(user, news)
        if self.settings.sink.kind == "slack":
            payload: dict[str, Any] = {"text": text}
            if contact.kind == "slack":
                payload["channel"] = contact.address
        else:
            payload = {
                "event": "job.owner",
                "id": ";".join(sorted(f"{n.incident}/{n.key}" for n in news)),  # a receiver may dedupe
                "to": {"kind": contact.kind, "address": contact.address},
                "user": user,
                "kinds": sorted({n.kind for n in news}),
                "jobs": sorted({n.job for n in news}),
                "incidents": sorted({n.incident for n in news}),
                "text": text,
            }
        with httpx.Client() as client:
            outcome = self.notifier.post(client, self.settings.sink, payload)
        for n in news:
            self.metrics.owner_notices.labels(kind=n.kind, outcome=outcome).inc()
        return outcome

    def _tell_on_call(self, news: list[Notice]) -> None:
        """Owners without a contact: on-call hears of their hit jobs once, whose they are."""
        hits = [n for n in news if n.kind == "hit"]
        if hits:
            whose: dict[str, list[int]] = {}
            for n in hits:
                whose.setdefault(n.user, []).append(n.job)
            said = "; ".join(
                f"user {u}: job(s) {', '.join(map(str, sorted(j)))}" for u, j in sorted(whose.items())
            )
            self.notifier.send(
                "job.owner_unknown",
                incident=hits[0].incident,
                node=hits[0].node,
                reason=f"no contact for the owner(s) of requeued jobs, please tell them: {said}"[:1000],
            )
        for n in news:
            self.metrics.owner_notices.labels(kind=n.kind, outcome="on_call").inc()
        self._record(news, NO_CONTACT)

    def _record(self, news: list[Notice], dest: str) -> None:
        """Told: one timeline entry per (incident, job, kind), "hit job 12 alice -> email:a@b.c"."""
        with self.journal.transaction() as tx:
            for n in news:
                tx.timeline(
                    n.incident, NOTICE_PHASE, "ok", source="runner", detail=f"{n.key} {n.user} -> {dest}"
                )

    # effective training time ------------------------------------------------------------------
    def _effective_training(self, hits: list[Hit], now: float) -> None:
        window = self.settings.cost_window_seconds
        # the settled incidents' costs, and those of the jobs this pass looked at (with the one
        # _cost() just recorded): no second read of the journal
        costs = [c for cs in self._settled.values() for c in cs]
        costs += [h.cost for h in hits if h.cost is not None]
        lost = lost_in_window(costs, now, window)
        self._pools |= set(lost) | {c.pool for c in costs}
        for pool in sorted(self._pools):
            ett = effective_training_time(lost.get(pool, 0.0), self.slurm.pool_gpus(pool), window)
            if ett is not None:
                self.metrics.effective_training.labels(pool=pool).set(ett)


def make_owner_loop(
    cfg: RunnerConfig,
    journal: Journal,
    metrics: Metrics,
    notifier: Notifier,
    pool_of: Callable[[Collection[str]], dict[str, str]],
    leading: Callable[[], bool],
) -> OwnerLoop | None:
    """The loop, when an owner sink is configured; the directory is read (and checked) now."""
    s = cfg.owners
    if s.sink is None:
        return None
    conf = cfg.play_vars.get("autoheal_slurm_conf")
    return OwnerLoop(
        s,
        journal,
        metrics,
        notifier,
        SlurmJobs(Path(str(conf)) if conf else None),
        OwnerDirectory.load(s.directory, s.mail_user),
        pool_of,
        leading,
    )
