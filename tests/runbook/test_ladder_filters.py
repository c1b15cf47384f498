"""The recovery ladder's filters: a check that did not run never passes."""

from __future__ import annotations

import json

from tests.runbook.conftest import plugin

ladder = plugin("filter.ladder")
evidence = plugin("filter.evidence_nodes")


def test_health_result_reads_the_check_and_fails_what_did_not_run():
    ok = {"rc": 0, "stdout": json.dumps({"node": "gpu-1", "healthy": True, "failures": []})}
    assert ladder.health_result(ok)["healthy"] is True
    sick = {"rc": 0, "stdout": json.dumps({"healthy": False, "failures": ["GPU 3: XID 79"]})}
    assert ladder.health_result(sick) == {"healthy": False, "failures": ["GPU 3: XID 79"]}
    for broken in ({"rc": 1, "stderr": "simulator: down\n  x"}, {"rc": 0, "stdout": "not json"}, {"rc": 0}):
        res = ladder.health_result(broken)
        assert res["healthy"] is False and res["failures"][0].startswith("health check did not run")
    # a forged or odd answer (healthy not a bool) does not pass either
    assert ladder.health_result({"rc": 0, "stdout": '{"healthy": "yes"}'})["healthy"] is False


def test_dcgm_result_passes_only_a_succeeded_job():
    assert ladder.dcgm_result({"resources": [{"status": {"succeeded": 1}}]})["healthy"] is True
    assert ladder.dcgm_result({"resources": [{"status": {"failed": 1}}]})["failures"] == ["dcgmi diag failed"]
    assert ladder.dcgm_result({"resources": []})["healthy"] is False


def test_command_outcome_splits_ok_failed_and_ignores_skipped():
    results = [
        {"item": "gpu-1", "rc": 0},
        {"item": "gpu-2", "rc": 1, "stderr": "reset of gpu-2: GPU 3 is not on the bus"},
        {"item": "gpu-3", "skipped": True},
        {"item": "gpu-4", "failed": True, "msg": "Job timed out"},
    ]
    out = ladder.command_outcome(results)
    assert out["ok"] == ["gpu-1"]
    assert out["failed"] == {"gpu-2": "reset of gpu-2: GPU 3 is not on the bus", "gpu-4": "Job timed out"}


def test_batch_results_reads_one_batch_call_as_a_loop_of_single_calls():
    nodes = ["gpu-1", "gpu-2", "gpu-3"]
    out = [
        {"item": "gpu-2", "rc": 1, "stdout": "", "stderr": "reboot gpu-2: hung"},
        {"item": "gpu-1", "rc": 0, "stdout": json.dumps({"healthy": True, "failures": []}), "stderr": ""},
        {"item": "gpu-9", "rc": 0, "stdout": "{}", "stderr": ""},  # not asked for: left out
    ]
    items = ladder.batch_results({"rc": 0, "stdout": json.dumps(out)}, nodes)
    assert [i["item"] for i in items] == nodes  # in the order asked, one per node
    assert items[0]["rc"] == 0 and ladder.health_result(items[0])["healthy"] is True
    assert items[1]["stderr"] == "reboot gpu-2: hung"
    assert items[2]["rc"] == 1 and "no result for this node" in items[2]["stderr"]
    assert ladder.command_outcome(items) == {
        "ok": ["gpu-1"],
        "failed": {"gpu-2": "reboot gpu-2: hung", "gpu-3": "no result for this node in the batch's output"},
    }


def test_batch_results_of_a_batch_that_did_not_run_fails_every_node_naming_why():
    items = ladder.batch_results({"rc": 2, "stdout": "", "stderr": "lab 'x' is not up"}, ["gpu-1", "gpu-2"])
    assert [(i["item"], i["rc"], i["stderr"]) for i in items] == [
        ("gpu-1", 1, "lab 'x' is not up"),
        ("gpu-2", 1, "lab 'x' is not up"),
    ]
    assert ladder.health_result(items[0]) == {
        "healthy": False,
        "failures": ["health check did not run: lab 'x' is not up"],
    }
    garbage = ladder.batch_results({"rc": 0, "stdout": "not json"}, ["gpu-1"])
    assert garbage[0]["rc"] == 1
    skipped = ladder.batch_results({"skipped": True}, ["gpu-1"])
    assert skipped == [{"item": "gpu-1", "skipped": True}] and ladder.command_outcome(skipped) == {
        "ok": [],
        "failed": {},
    }


def test_evidence_nodes_builds_one_entry_per_node_from_the_batch_health_readings():
    """The evidence module's batch from the ladder's readings: each node its incident, the sources
    its health check named, its validation failures; a node without a reading gets no sources."""
    nodes = ["gpu-1", "gpu-2", "gpu-3"]
    out = [
        {
            "item": "gpu-1",
            "rc": 0,
            "stdout": json.dumps(
                {
                    "node": "gpu-1",
                    "healthy": False,
                    "failures": ["GPU 3: XID 79"],
                    "gpus": [{"gpu": 3, "uuid": "GPU-1", "serial": "1652"}],
                    "kmsg": "/lab/kmsg/gpu-1/kmsg",
                    "metrics_url": "http://127.0.0.1:9/metrics",
                }
            ),
            "stderr": "",
        },
        {"item": "gpu-2", "rc": 1, "stdout": "", "stderr": "simulator: down"},
    ]
    readings = [
        ladder.health_result(i) for i in ladder.batch_results({"rc": 0, "stdout": json.dumps(out)}, nodes)
    ]
    got = evidence.evidence_nodes(
        nodes, {"gpu-1": "inc-1", "gpu-2": "inc-2"}, readings, {"gpu-2": "GPU 0: lost"}
    )
    assert [e["node"] for e in got] == nodes
    assert got[0] == {
        "node": "gpu-1",
        "incident_id": "inc-1",
        "kmsg": "/lab/kmsg/gpu-1/kmsg",
        "metrics_url": "http://127.0.0.1:9/metrics",
        "gpus": [{"gpu": 3, "uuid": "GPU-1", "serial": "1652"}],
        "validation": {},
    }
    # a check that did not run: no sources, but the node still gets its bundle (and its failures)
    assert got[1] == {
        "node": "gpu-2",
        "incident_id": "inc-2",
        "kmsg": "",
        "metrics_url": "",
        "gpus": [],
        "validation": {"failures": "GPU 0: lost"},
    }
    assert got[2]["incident_id"] == "manual" and got[2]["kmsg"] == ""
    # no lab: no readings at all; readings keyed by node work as well
    assert [e["kmsg"] for e in evidence.evidence_nodes(nodes, {}, [], None)] == ["", "", ""]
    by_node = evidence.evidence_nodes(["gpu-2"], None, {"gpu-2": {"kmsg": "/k", "gpus": "junk"}})
    assert by_node == [
        {
            "node": "gpu-2",
            "incident_id": "manual",
            "kmsg": "/k",
            "metrics_url": "",
            "gpus": [],
            "validation": {},
        }
    ]
