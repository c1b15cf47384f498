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


DIAG = {
    "DCGM GPU Diagnostic": {
        "version": "4.2.3",
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [{"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "Pass"}]}],
            },
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "Memory",
                        "results": [
                            {"gpu_ids": "0", "status": "Pass"},
                            {"gpu_ids": "1", "status": "Fail", "warnings": ["DBE on GPU 1"]},
                        ],
                    }
                ],
            },
        ],
    }
}


def _diag(ok: bool, doc: object, prefix: str = "") -> dict:
    return {
        "ok": ok,
        "exit_code": 0 if ok else 1,
        "reason": "Completed" if ok else "Failed exit 1: x",
        "logs": prefix + json.dumps(doc),
    }


def test_dcgm_result_passes_only_a_completed_job_whose_json_lists_no_failed_test():
    passing = json.loads(json.dumps(DIAG))
    passing["DCGM GPU Diagnostic"]["test_categories"][1]["tests"][0]["results"][1]["status"] = "Pass"
    # dcgmi may print a line before its JSON
    assert ladder.dcgm_result(_diag(True, passing, "WARNING: something\n")) == {
        "healthy": True,
        "failures": [],
    }
    # the log merges stdout and stderr in no set order: a stderr line inside the document
    lines = json.dumps(passing, indent=1).splitlines()
    mixed = "\n".join([*lines[:3], "dcgmi diag -j -r 1", *lines[3:]])
    assert ladder.dcgm_result({"ok": True, "exit_code": 0, "logs": mixed})["healthy"] is True
    failed = ladder.dcgm_result(_diag(False, DIAG))
    assert failed["healthy"] is False
    assert failed["failures"] == ["dcgmi diag exited 1", "Memory on GPU 1: Fail (DBE on GPU 1)"]
    # exit 0 without results, or without JSON, never passes
    empty = ladder.dcgm_result(_diag(True, {"DCGM GPU Diagnostic": {"version": "4"}}))
    assert empty["healthy"] is False and "no test results" in empty["failures"][0]
    assert ladder.dcgm_result({"ok": True, "logs": "all good"})["healthy"] is False
    # a Job that never ran (Pending, refused) fails naming why
    pending = {
        "ok": False,
        "reason": "Pending 180 s: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu",
        "logs": "",
    }
    assert ladder.dcgm_result(pending)["failures"] == [f"dcgmi diag: {pending['reason']}"]
    assert ladder.dcgm_result("refused: the GPUs are in use by a/b") == {
        "healthy": False,
        "failures": ["refused: the GPUs are in use by a/b"],
    }


def test_holders_outcome_refuses_foreign_pods_and_fails_agents_that_stay():
    before = {
        "users": {"gpu-2": ["team/train-0 (2 nvidia.com/gpu)"]},
        "agents": {"gpu-1": ["m/dcgm-x"]},
        "failed": {"gpu-4": "the node does not exist"},
    }
    after = {"agents": {"gpu-3": ["m/dcgm-y"]}, "users": {}, "failed": {}}
    out = ladder.holders_outcome(
        before, ["gpu-1", "gpu-2", "gpu-3", "gpu-4"], after, "autoheal.io/gpu-agents"
    )
    assert out["free"] == ["gpu-1"]
    assert (
        out["failed"]["gpu-2"]
        == "refused: the GPUs are in use by team/train-0 (2 nvidia.com/gpu), not autoheal's to stop"
    )
    assert out["failed"]["gpu-3"].startswith("GPU agents still running: m/dcgm-y")
    assert out["failed"]["gpu-4"] == "the node does not exist"


def test_reset_scope_resets_every_gpu_together_unless_a_known_non_nvswitch_product_names_one():
    infos = {
        "hgx": {"labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "pcie": {"labels": {"nvidia.com/gpu.product": "NVIDIA-L40S"}},
        "unknown": {"labels": {}},
    }
    nodes = ["hgx", "pcie", "unknown"]
    regex = "SXM|HBM3|H200|B200|GB200|HGX|DGX"
    assert ladder.reset_scope(infos, nodes, "auto", 3, regex) == {"all": ["hgx", "unknown"], "one": ["pcie"]}
    assert ladder.reset_scope(infos, nodes, "auto", None, regex) == {"all": nodes, "one": []}
    assert ladder.reset_scope(infos, nodes, "gpu", 3, regex) == {"all": [], "one": nodes}
    assert ladder.reset_scope(infos, nodes, "all", 3, regex) == {"all": nodes, "one": []}


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
