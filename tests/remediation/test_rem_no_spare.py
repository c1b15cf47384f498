"""A storm that outruns the pool's hot spares ends well (issue 18): every incident completes
"no spare: jobs wait for capacity" and the pool gets ONE notification saying how many nodes wait,
not one page per node, however many runs the storm takes."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from remediation.app import create_app
from remediation.notify import SpareShortage
from remediation.worker import NO_SPARE_REASON
from tests.remediation.remhelp import AUTH, alert, effect_lines, payload
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)


def test_spare_exhaustion_completes_every_incident_with_one_notification(
    runtime_factory, effects, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOHEAL_STUB_NO_SPARE", "1")
    monkeypatch.setenv("AUTOHEAL_STUB_DETAIL_NO_SPARE", "no spare: jobs wait for capacity (pool h100)")
    rt = runtime_factory(
        budgets={"max_nodes": 20, "max_pool_percent": 100}, max_batch=4, batch_window_seconds=0.3
    )
    with TestClient(create_app(rt)) as client:
        r = client.post("/webhook", json=payload(*[alert(f"gpu-{i}") for i in range(1, 11)]), headers=AUTH)
        ids = r.json()["created"]
        assert len(ids) == 10
        wait_for(lambda: len(rt.journal.incidents(["completed", "failed"])) == 10, 120, "the storm to end")
        assert len({run.id for run in rt.journal.runs() if run.source == "worker"}) >= 3  # several runs
        for iid in ids:
            inc = rt.journal.incident(iid)
            assert (inc.state, inc.reason) == ("completed", NO_SPARE_REASON)
        wait_for(lambda: any(n["event"] == "pool.spares_exhausted" for n in rt.notifier.sent), 10, "the page")
        [page] = [n for n in rt.notifier.sent if n["event"] == "pool.spares_exhausted"]
        assert page["pool"] == "h100" and page["waiting"] == 10
        assert sorted(page["nodes"]) == sorted(f"gpu-{i}" for i in range(1, 11))
        per_node = [n for n in rt.notifier.sent if n["event"] in ("incident.failed", "incident.completed")]
        assert per_node == []  # no page per node


def test_shortage_holds_until_the_runs_end_then_rearms() -> None:
    sent: list[tuple[str, dict[str, object]]] = []
    s = SpareShortage(lambda event, **f: sent.append((event, f)), max_hold_seconds=60, rearm_seconds=600)
    s.add("h100", "gpu-1", "inc-1", now=0)
    s.add("h100", "gpu-2", "inc-2", now=1)
    assert s.flush(busy=True, now=30) == [] and sent == []  # runs still going: keep counting
    s.add("a100", "gpu-9", "inc-9", now=31)
    assert s.flush(busy=True, now=61) == ["h100"]  # held past max_hold: tell now
    assert sent[0][1]["waiting"] == 2
    s.add("h100", "gpu-3", "inc-3", now=62)  # within the re-arm window: counted, not paged
    assert s.flush(busy=False, now=63) == ["a100"] and s.quiet == {"h100": 1}
    s.add("h100", "gpu-4", "inc-4", now=700)  # after it: a new page
    assert s.flush(busy=False, now=701) == ["h100"] and len(sent) == 3


@pytest.mark.parametrize("fence_held", [True, False])
def test_past_the_budget_held_nodes_are_fenced_only_as_config_says(
    runtime_factory, effects, fence_held
) -> None:
    """Issue 18: a storm bigger than the budget trips the breaker; with budgets.fence_held_nodes
    every held node is still fenced (and nothing else is done to it), without it none is."""

    from remediation.policy import breaker_state

    rt = runtime_factory(
        budgets={"max_nodes": 3, "max_pool_percent": 100, "fence_held_nodes": fence_held},
        batch_window_seconds=0.3,
    )
    with TestClient(create_app(rt)) as client:
        client.post("/webhook", json=payload(*[alert(f"gpu-{i}") for i in range(1, 11)]), headers=AUTH)
        wait_for(lambda: len(rt.journal.incidents(["completed"])) == 3, 120, "the budgeted three")
        fenced = lambda: {x.split()[1] for x in effect_lines(effects) if x.startswith("fenced ")}  # noqa: E731
        if fence_held:
            wait_for(lambda: len(fenced()) == 10, 60, "every held node fenced")
        else:
            import time

            time.sleep(3)
            assert len(fenced()) == 3
        assert breaker_state(rt.journal).open and len(rt.journal.incidents(["held"])) == 7
        destructive = [x for x in effect_lines(effects) if not x.startswith("fenced ")]
        assert {x.split()[1] for x in destructive} == {i.node for i in rt.journal.incidents(["completed"])}
