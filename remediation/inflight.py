"""What the worker has under way, in this runner's memory: runs in flight, their nodes, and how far
fence first has got with each incident; one lock, one table of the moves a mark may make.

The journal is the queue (remediation/states.py); this is the worker's own, smaller state beside
it, never journaled: a restarted runner finds its runs in the journal (remediation/recovery.py) and
fences again what it does not remember fencing (the play's fence step then changes nothing).

A mark says what fence first (remediation/batches.py) has done for an incident; `NEW` (nothing) is
the default and is not kept::

    NEW --(fence-only run ended)--> FENCED --(no longer admitted)--> NEW
     |
     +--(held, fence-only run launched)--> HELD --(no longer held)--> NEW
                                            |  ^
                          (fence-only run ended) (no longer admitted)
                                            v  |
                                         HELD_FENCED --(no longer held)--> FENCED

Every move goes through `InFlight._move`, which checks it against `TRANSITIONS` and refuses, logs
and raises anything else (IllegalMark), as the journal does for incident states.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from enum import StrEnum

from remediation.errors import IllegalMark

log = logging.getLogger(__name__)


class RunKind(StrEnum):
    """What a run is for. The value is the run's `source` in the journal."""

    FULL = "worker"  # the whole runbook; the run closes its incidents
    FENCE = "fence"  # fence first: the runbook up to `fenced`; its incidents stay admitted

    @property
    def stop_after(self) -> str:
        """The play's `autoheal_stop_after`: the phase after which it ends ("" = the end)."""
        return "fenced" if self is RunKind.FENCE else ""


class Mark(StrEnum):
    """How far fence first has got with one incident (the diagram above)."""

    NEW = "new"  # nothing done yet (not kept)
    FENCED = "fenced"  # a fence-only run handled it: while admitted, its full run need not wait
    HELD = "held"  # held past the budget and sent to a fence-only run: not again while held
    HELD_FENCED = "held_fenced"  # HELD, and that run ended: FENCED too, should it be admitted now


M = Mark
TRANSITIONS: Mapping[Mark, frozenset[Mark]] = {
    M.NEW: frozenset({M.FENCED, M.HELD}),
    M.FENCED: frozenset({M.NEW}),
    M.HELD: frozenset({M.HELD_FENCED, M.NEW}),
    M.HELD_FENCED: frozenset({M.HELD, M.FENCED}),
}


# what each event makes of a mark; the table then says whether that is a move it may make
_FENCE_ENDED = {M.NEW: M.FENCED, M.HELD: M.HELD_FENCED}
_HELD_FENCE_LAUNCHED = {M.NEW: M.HELD, M.FENCED: M.HELD_FENCED}  # the latter: admitted is never held


def allowed(current: Mark, new: Mark) -> bool:
    """Whether a mark may move from `current` to `new` (the same mark is not a move)."""
    return new in TRANSITIONS[current]


@dataclass(frozen=True)
class Flight:
    """One run under way: what it is for, and the thread running it."""

    kind: RunKind
    future: Future[None]


class InFlight:
    """The runs under way, their nodes and the incidents' marks, behind one lock (the worker's
    loop, its run threads and the elector's thread all read it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, Flight] = {}
        # a set, not counted per run: a node is freed by the first of its runs to end, as before
        self._nodes: set[str] = set()
        self._marks: dict[str, Mark] = {}

    # runs -------------------------------------------------------------------------------------
    def launch(
        self, run_id: int, kind: RunKind, nodes: Iterable[str], submit: Callable[[], Future[None]]
    ) -> None:
        """Record a run and start it (`submit`) under the lock, so its end (`land`, from the run's
        own thread) always finds it recorded."""
        with self._lock:
            self._nodes.update(nodes)
            self._runs[run_id] = Flight(kind, submit())

    def land(self, run_id: int, kind: RunKind, incident_ids: Iterable[str], nodes: Iterable[str]) -> None:
        """A run ended: free its nodes; a fence-only run's incidents are fenced now."""
        with self._lock:
            self._runs.pop(run_id, None)
            self._nodes.difference_update(nodes)
            if kind is RunKind.FENCE:
                for iid in incident_ids:
                    now = self._marks.get(iid, M.NEW)
                    # fenced already (or a move to itself): refused by the table, never launched so
                    self._move(iid, now, _FENCE_ENDED.get(now, now))

    def count(self, kind: RunKind) -> int:
        with self._lock:
            return sum(1 for f in self._runs.values() if f.kind is kind)

    @property
    def busy(self) -> bool:
        """Any run under way, of either kind."""
        with self._lock:
            return bool(self._runs)

    def run_ids(self) -> set[int]:
        with self._lock:
            return set(self._runs)

    def node_busy(self, node: str) -> bool:
        with self._lock:
            return node in self._nodes

    # marks ------------------------------------------------------------------------------------
    def mark(self, incident_id: str) -> Mark:
        with self._lock:
            return self._marks.get(incident_id, M.NEW)

    def fenced(self, incident_ids: Iterable[str]) -> set[str]:
        """Those of `incident_ids` a fence-only run has handled (FENCED or HELD_FENCED)."""
        with self._lock:
            return {i for i in incident_ids if self._marks.get(i) in (M.FENCED, M.HELD_FENCED)}

    def held_fenced(self, incident_ids: Iterable[str]) -> set[str]:
        """Those of `incident_ids` sent to a fence-only run while held (HELD or HELD_FENCED)."""
        with self._lock:
            return {i for i in incident_ids if self._marks.get(i) in (M.HELD, M.HELD_FENCED)}

    def fence_held(self, incident_ids: Iterable[str]) -> None:
        """Held incidents are about to get their fence-only run."""
        with self._lock:
            for iid in incident_ids:
                now = self._marks.get(iid, M.NEW)
                self._move(iid, now, _HELD_FENCE_LAUNCHED.get(now, now))

    def keep_fenced(self, admitted: Collection[str]) -> None:
        """Forget that fence-only runs handled incidents no longer admitted."""
        with self._lock:
            for iid, now in list(self._marks.items()):
                if iid not in admitted and now in (M.FENCED, M.HELD_FENCED):
                    self._move(iid, now, M.NEW if now is M.FENCED else M.HELD)

    def keep_held(self, held: Collection[str]) -> None:
        """Forget the held fences of incidents no longer held (a breaker reset sends them back to
        pending)."""
        with self._lock:
            for iid, now in list(self._marks.items()):
                if iid not in held and now in (M.HELD, M.HELD_FENCED):
                    self._move(iid, now, M.NEW if now is M.HELD else M.FENCED)

    def _move(self, incident_id: str, current: Mark, new: Mark) -> None:
        """The one place a mark changes (the lock is held)."""
        if not allowed(current, new):
            log.error("refused illegal in-flight move of incident %s: %s -> %s", incident_id, current, new)
            raise IllegalMark(f"incident {incident_id}: {current} -> {new} is not an allowed move")
        if new is M.NEW:
            del self._marks[incident_id]
        else:
            self._marks[incident_id] = new
