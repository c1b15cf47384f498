"""The recovery ladder in the policy: repeats climb one rung, application XIDs repeating on one GPU
are reset and validated (diagnostics), and the first fault of each kind stays on its own rung."""

from __future__ import annotations

import time

import pytest

from autoheal.xid import load_catalog
from remediation.kubeview import FakeKube
from remediation.policy import Policy
from tests.remediation.test_rem_policy import _open, journal  # noqa: F401  (the fixture)


def _first(cfg, j):
    decisions, _ = Policy(cfg, j, FakeKube(), load_catalog()).decide(j.incidents(["pending"]), time.time())
    return decisions[0]


@pytest.mark.parametrize(
    ("xid", "tier", "climbs_to"),
    [(8, "restart_app", "reset"), (48, "reset", "reboot"), (79, "reboot", "replace")],
)
def test_repeats_on_a_node_climb_one_rung(config_factory, journal, xid, tier, climbs_to):  # noqa: F811
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    assert _first(cfg, _seed(journal, xid, tier, 1)).tier == tier
    _seed(journal, xid, tier, load_catalog().escalation.repeats - 1)
    d = _first(cfg, journal)
    assert d.action == "admit" and d.tier == climbs_to and f"escalated to {climbs_to}" in d.reason


def test_xid_13_twice_on_one_gpu_is_reset_for_diagnostics(config_factory, journal):  # noqa: F811
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    _seed(journal, 13, "restart_app", 1)
    assert _first(cfg, journal).tier == "restart_app"
    _seed(journal, 31, "restart_app", 1)  # 13 and 31 count together: both are the GPU's memory path
    d = _first(cfg, journal)
    assert d.tier == "reset" and "diagnostics" in d.reason and "GPU 0" in d.reason


def test_quarantine_and_replace_are_the_top(config_factory, journal):  # noqa: F811
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    _seed(journal, 999, "quarantine", 4)
    assert _first(cfg, journal).tier == "quarantine"


def _seed(j, xid, tier, n):
    for _ in range(n):
        _open(j, "gpu-1", xid=xid, tier=tier)
    return j


def test_gpu_repeats_are_counted_in_a_storm_bigger_than_any_page(config_factory, journal):  # noqa: F811
    """The rule once read the newest 1000 incidents: in a storm the first XID 13 fell off the page."""
    cfg = config_factory(node_cap={"max_incidents": 10, "window_seconds": 3600})
    _seed(journal, 13, "restart_app", 1)
    for n in range(1100):
        _open(journal, f"gpu-{100 + n}", xid=79, tier="reboot")
    _seed(journal, 31, "restart_app", 1)
    assert journal.count_gpu_incidents("gpu-1", 0, (13, 31), 0) == 2
    assert journal.count_gpu_incidents("gpu-1", 1, (13, 31), 0) == 0  # another GPU of the node
    assert journal.count_gpu_incidents("gpu-1", 0, (13, 31), time.time() + 1) == 0  # the window
    latest = [i for i in journal.incidents(["pending"], limit=5000) if i.node == "gpu-1"][-1]
    (d,), _ = Policy(cfg, journal, FakeKube(), load_catalog()).decide([latest], time.time())
    assert d.tier == "reset" and "diagnostics" in d.reason
