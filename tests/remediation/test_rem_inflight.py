"""The worker's in-flight state (remediation/inflight.py): its runs and nodes, and the table of
moves an incident's fence-first mark may make, checked as the journal checks incident states."""

from __future__ import annotations

import itertools
import re
import threading
from concurrent.futures import Future
from pathlib import Path

import pytest

from remediation.errors import IllegalMark
from remediation.inflight import TRANSITIONS, InFlight, Mark, RunKind, allowed

M = Mark


def _done() -> Future[None]:
    fut: Future[None] = Future()
    fut.set_result(None)
    return fut


def _fence(flight: InFlight, run_id: int, *ids: str) -> None:
    """A fence-only run of `ids` (on nodes named after them) launched and ended."""
    nodes = [f"node-{i}" for i in ids]
    flight.launch(run_id, RunKind.FENCE, nodes, _done)
    flight.land(run_id, RunKind.FENCE, ids, nodes)


def test_the_documented_diagram_is_the_table():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    [diagram] = [d.split("```", 1)[0] for d in doc.split("stateDiagram-v2")[1:] if "held_fenced" in d]
    edges = set(re.findall(r"^\s*([a-z_]+) --> ([a-z_]+)", diagram, re.MULTILINE))
    assert edges == {(a.value, b.value) for a, nexts in TRANSITIONS.items() for b in nexts}


def test_every_mark_has_a_row_and_none_is_a_dead_end():
    assert set(TRANSITIONS) == set(Mark)
    for start in Mark:  # from every mark NEW is reachable (forgetting never gets stuck), and back
        seen, todo = {start}, [start]
        while todo:
            for nxt in TRANSITIONS[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        assert seen == set(Mark), start


def test_allowed_is_the_table_and_the_same_mark_is_not_a_move():
    for a, b in itertools.product(Mark, Mark):
        assert allowed(a, b) == (b in TRANSITIONS[a])
        if a is b:
            assert not allowed(a, b)


def test_an_admitted_incident_is_fenced_by_its_fence_only_run_and_forgotten_once_not_admitted():
    flight = InFlight()
    _fence(flight, 1, "a", "b")
    assert flight.mark("a") is M.FENCED and flight.fenced(["a", "b", "c"]) == {"a", "b"}
    flight.keep_fenced({"a"})  # b started its full run (or closed)
    assert flight.mark("a") is M.FENCED and flight.mark("b") is M.NEW
    flight.keep_held(set())  # nothing held: FENCED is not a held mark and stays
    assert flight.mark("a") is M.FENCED


def test_a_held_incident_is_fenced_once_while_held():
    flight = InFlight()
    flight.fence_held(["h"])
    assert flight.mark("h") is M.HELD and flight.held_fenced(["h", "x"]) == {"h"}
    assert flight.fenced(["h"]) == set()  # launched, not ended
    _fence(flight, 1, "h")
    assert flight.mark("h") is M.HELD_FENCED and flight.fenced(["h"]) == {"h"}
    flight.keep_fenced(set())  # still held, not admitted: only the held half is kept
    assert flight.mark("h") is M.HELD
    flight.keep_held({"h"})
    assert flight.mark("h") is M.HELD
    flight.keep_held(set())  # the breaker was reset: back to pending, fenced again if need be
    assert flight.mark("h") is M.NEW


def test_a_held_incident_admitted_right_after_its_fence_ended_counts_as_fenced():
    flight = InFlight()
    flight.fence_held(["h"])
    _fence(flight, 1, "h")
    flight.keep_fenced({"h"})
    flight.keep_held(set())
    assert flight.mark("h") is M.FENCED


def test_a_fence_ending_after_the_breaker_reset_marks_it_fenced():
    flight = InFlight()
    flight.fence_held(["h"])
    flight.launch(1, RunKind.FENCE, ["node-h"], _done)
    flight.keep_held(set())  # reset while its fence runs
    assert flight.mark("h") is M.NEW
    flight.land(1, RunKind.FENCE, ["h"], ["node-h"])
    assert flight.mark("h") is M.FENCED


def _fenced(flight: InFlight) -> None:
    _fence(flight, 1, "x")


def _held(flight: InFlight) -> None:
    flight.fence_held(["x"])


def _held_fenced(flight: InFlight) -> None:
    flight.fence_held(["x"])
    _fence(flight, 1, "x")


@pytest.mark.parametrize(
    ("setup", "before", "move", "after"),
    [
        (_fenced, M.FENCED, lambda f: _fence(f, 2, "x"), M.FENCED),  # fenced again: never launched so
        (_held, M.HELD, lambda f: f.fence_held(["x"]), M.HELD),  # a held fence launched twice
        (_fenced, M.FENCED, lambda f: f.fence_held(["x"]), M.HELD_FENCED),  # admitted is never held
        (_held_fenced, M.HELD_FENCED, lambda f: _fence(f, 2, "x"), M.HELD_FENCED),
        (_held_fenced, M.HELD_FENCED, lambda f: f.fence_held(["x"]), M.HELD_FENCED),
    ],
)
def test_an_illegal_move_is_refused_logged_and_raised_and_changes_no_mark(caplog, setup, before, move, after):
    flight = InFlight()
    setup(flight)
    assert flight.mark("x") is before
    with pytest.raises(IllegalMark, match=f"{before} -> {after}"):
        move(flight)
    assert flight.mark("x") is before
    assert f"{before} -> {after}" in caplog.text


def test_runs_and_nodes_are_counted_by_kind_and_freed_when_they_land():
    flight = InFlight()
    assert not flight.busy
    flight.launch(1, RunKind.FULL, ["n1", "n2"], _done)
    flight.launch(2, RunKind.FENCE, ["n3"], _done)
    assert flight.busy and flight.run_ids() == {1, 2}
    assert (flight.count(RunKind.FULL), flight.count(RunKind.FENCE)) == (1, 1)
    assert flight.node_busy("n2") and flight.node_busy("n3") and not flight.node_busy("n4")
    flight.land(1, RunKind.FULL, ["a", "b"], ["n1", "n2"])
    assert flight.mark("a") is M.NEW  # a full run marks nothing
    assert not flight.node_busy("n1") and flight.count(RunKind.FULL) == 0 and flight.busy
    flight.land(2, RunKind.FENCE, ["c"], ["n3"])
    assert not flight.busy and not flight.node_busy("n3") and flight.mark("c") is M.FENCED


def test_an_illegal_landing_still_frees_the_run_and_its_nodes():
    flight = InFlight()
    _fence(flight, 1, "x")
    flight.launch(2, RunKind.FENCE, ["node-x"], _done)
    with pytest.raises(IllegalMark):
        flight.land(2, RunKind.FENCE, ["x"], ["node-x"])
    assert not flight.busy and not flight.node_busy("node-x")


def test_a_run_that_ends_at_once_lands_after_it_was_recorded():
    """launch submits under the lock: a run whose thread ends before launch returns still finds
    itself recorded, and its landing is not lost."""
    flight = InFlight()
    landed = threading.Event()

    def submit() -> Future[None]:
        def body() -> None:
            flight.land(7, RunKind.FULL, ["a"], ["n"])
            landed.set()

        threading.Thread(target=body).start()
        assert not landed.wait(0.2)  # blocked on the lock until launch has recorded the run
        return _done()

    flight.launch(7, RunKind.FULL, ["n"], submit)
    assert landed.wait(5)
    assert not flight.busy and not flight.node_busy("n")
