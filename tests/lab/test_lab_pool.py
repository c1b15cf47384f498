"""The lab's pool controller behaves like a cloud autoscaling group."""

import json

import pytest

from autoheal.errors import LabError
from lab import pool, procs
from tests.support import wait_for

pytestmark = pytest.mark.lab


def test_retired_node_is_backfilled_as_a_drained_hot_spare(lab, slurm):
    before = pool.client_status(lab)["pools"]["h100"]
    assert len(before["members"]) == before["declared"] == 6
    res = pool.client_retire(lab, "gpu-6")
    assert res == {"node": "gpu-6", "changed": True, "state": "retired"}
    assert "slurmd-gpu-6" not in procs.running(lab.run_dir)

    def backfilled():
        # a member first, then the simulator learns of it, then the controller reports it ready
        status = pool.client_status(lab)
        s = status["pools"]["h100"]
        ready = any(
            e["event"] == "replacement_ready" and e["node"] not in before["members"] for e in status["events"]
        )
        return s if len(s["members"]) == 6 and ready else None

    st = wait_for(backfilled, 30, "backfill")
    new = [n for n in st["members"] if n not in before["members"]]
    assert new == ["gpu-7"]  # the first FUTURE name; retired names are never reused
    assert f"slurmd-{new[0]}" in procs.running(lab.run_dir)
    sinfo = json.loads(slurm("sinfo", "--json"))
    node = next(n for n in sinfo["nodes"] if n["name"] == "gpu-7")
    assert "DRAIN" in node["state_flags"] and node["reason"] == "autoheal: hot spare"
    events = [e["event"] for e in pool.client_status(lab)["events"] if e["node"] in ("gpu-6", "gpu-7")]
    assert events == ["retired", "provisioning", "replacement_ready"]


def test_retiring_twice_changes_nothing(lab):
    if "gpu-6" not in pool.client_status(lab)["retired"]:
        pool.client_retire(lab, "gpu-6")
    assert pool.client_retire(lab, "gpu-6")["changed"] is False


def test_retiring_a_node_outside_the_pools_is_refused(lab):
    with pytest.raises(LabError, match="not a member"):
        pool.client_retire(lab, "gpu-99")
    with pytest.raises(LabError, match="node"):
        pool.client_retire(lab, "../etc")
