"""The fencing token (issue 17, Deliver 4): a replica that no longer leads cannot write.

Two journal handles stand for two replicas' workers on one journal (SQLite and PostgreSQL); each
has its JournalFence as the guard of its writes (remediation/fencing.py), as the runtime wires it.
"""

from __future__ import annotations

import pytest

from remediation.errors import NotLeader
from remediation.fencing import LEADER_KEY, JournalFence
from remediation.leader import Term


def _worker(journal_target):
    """A replica's two handles: the unguarded one (webhook, claims) and the worker's guarded one."""
    plain = journal_target.open()
    guarded = journal_target.open()
    fence = JournalFence(plain)
    guarded.guard = fence.check
    return plain, guarded, fence


def _run(journal, node="gpu-1"):
    with journal.transaction() as tx:
        return tx.create_run(
            playbook="gpu_fatal_xid.yml", incident_ids=[], nodes=[node], check_mode=False, source="worker"
        )


def test_only_the_last_claimant_writes_and_the_deposed_one_writes_nothing(journal_target):
    _, a, fence_a = _worker(journal_target)
    _, b, fence_b = _worker(journal_target)
    with pytest.raises(NotLeader, match="does not lead"):
        _run(a)  # never claimed
    assert fence_a.claim(Term("a", 0)) == 0
    _run(a)
    assert fence_b.claim(Term("b", 1)) == 1
    _run(b)
    before = len(a.runs())
    with pytest.raises(NotLeader, match=r"deposed: the journal's leader is b \(term 1\), not a \(term 0\)"):
        _run(a, "gpu-2")
    assert len(a.runs()) == before  # the refused transaction wrote nothing
    assert a.setting(LEADER_KEY)["holder"] == "b"


def test_terms_only_grow_even_when_the_lease_starts_again(journal_target):
    """A deleted and recreated Lease counts its transitions from 0 again; the journal's term
    still grows, so an old leader's token can never match a new one."""
    _, _, fence = _worker(journal_target)
    assert fence.claim(Term("a", 5)) == 5
    assert fence.claim(Term("b", 0)) == 6  # the Lease was recreated
    assert fence.claim(Term("a", 1)) == 7
    assert fence.term == 7


def test_a_released_claim_refuses_and_the_webhook_handle_is_never_fenced(journal_target):
    plain, guarded, fence = _worker(journal_target)
    fence.claim(Term("a", 0))
    _run(guarded)
    fence.release()
    with pytest.raises(NotLeader):
        _run(guarded)
    _run(plain)  # a follower still journals alerts and incidents
    assert len(plain.runs()) == 2
