"""The leader's fencing token in the journal: a deposed leader cannot write.

Leader election (remediation/leader.py) makes one replica the leader, but a leader can be deposed
without knowing it yet: paused by the kernel, cut off from the API server, its Lease taken over.
Its worker may then be in the middle of a transaction. So the journal itself carries the term:

- a new leader *claims* the journal: in one transaction it reads the stored term, writes
  `max(stored + 1, lease transitions)` with its identity (setting `leader`);
- every write of the leader's worker goes through a journal handle whose guard re-reads that
  setting inside the same transaction (after the write lock is taken) and refuses the
  transaction (NotLeader, nothing written) when another replica has claimed since.

The webhook's writes (alerts, new incidents) are not guarded: every replica journals alerts, so
Alertmanager never sees an error while the leadership moves.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from remediation.errors import NotLeader
from remediation.journal import Journal, Tx
from remediation.leader import Term

log = logging.getLogger(__name__)
LEADER_KEY = "leader"


class JournalFence:
    """This replica's claim on the journal; `check` is the guard of the worker's journal handle."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal  # unguarded: the claim itself must be able to write
        self._mine: tuple[str, int] | None = None
        self._lock = threading.Lock()

    @property
    def term(self) -> int | None:
        mine = self._mine
        return None if mine is None else mine[1]

    def claim(self, term: Term) -> int:
        """Take the journal for `term`; returns the journal term (the fencing token)."""
        with self._journal.transaction() as tx:
            stored: dict[str, Any] = tx.setting(LEADER_KEY) or {}
            number = max(int(stored.get("term", -1)) + 1, term.transitions)
            record = {"holder": term.holder, "term": number, "lease_transitions": term.transitions}
            tx.set_setting(LEADER_KEY, {**record, "since": tx.now}, actor=term.holder)
        with self._lock:
            self._mine = (term.holder, number)
        log.info("journal claimed by %s (term %d; before: %s)", term.holder, number, stored or "none")
        return number

    def release(self) -> None:
        """Forget our claim: from now on this handle's writes are refused."""
        with self._lock:
            self._mine = None

    def check(self, tx: Tx) -> None:
        """Guard: raise NotLeader unless the journal's leader is still us, in our term."""
        mine = self._mine
        if mine is None:
            raise NotLeader("this replica does not lead; the worker may not write")
        stored = tx.setting(LEADER_KEY) or {}
        if (stored.get("holder"), stored.get("term")) != mine:
            raise NotLeader(
                f"deposed: the journal's leader is {stored.get('holder')} (term {stored.get('term')}),"
                f" not {mine[0]} (term {mine[1]})"
            )
