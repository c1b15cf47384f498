"""The Slurm helpers of the collection, without a cluster: hostlists and both JSON layouts."""

from __future__ import annotations

import pytest

from tests.runbook.conftest import module_utils

slurm = module_utils("slurm")
hostlist = module_utils("hostlist")
validate = module_utils("validate")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-[1-3]", ["gpu-1", "gpu-2", "gpu-3"]),
        ("gpu-[1,3],cpu-1", ["gpu-1", "gpu-3", "cpu-1"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu-7", ["gpu-7"]),
        ("", []),
    ],
)
def test_hostlist_expands_like_scontrol(text, names):
    assert hostlist.expand_hostlist(text) == names


def test_hostlist_compress_round_trips():
    names = [f"gpu-{i}" for i in (1, 2, 3, 5, 10, 11)] + ["login"]
    text = hostlist.compress_hostlist(names)
    assert text == "login,gpu-[1-3,5,10-11]"
    assert sorted(hostlist.expand_hostlist(text)) == sorted(names)


def test_sinfo_2205_layout_state_string_and_flags_list():
    data = {
        "nodes": [
            {
                "name": "gpu-5",
                "state": "idle",
                "state_flags": ["DRAIN"],
                "reason": "autoheal: hot spare",
                "comment": "",
                "active_features": "pool_h100",
                "partitions": ["batch"],
            }
        ]
    }
    rec = slurm.parse_sinfo(data)["gpu-5"]
    assert rec["state"] == "idle" and rec["drained"] and not rec["down"]
    assert rec["features"] == ["pool_h100"] and rec["reason"] == "autoheal: hot spare"


def test_sinfo_newer_layout_state_list():
    data = {
        "nodes": [
            {
                "name": "gpu-3",
                "state": ["DOWN", "DRAIN", "NOT_RESPONDING"],
                "reason": "autoheal: XID 79",
                "features": ["pool_h100"],
            }
        ]
    }
    rec = slurm.parse_sinfo(data)["gpu-3"]
    assert rec["down"] and rec["drained"] and not rec["responding"]


def test_sinfo_24x_grouped_layout():
    data = {
        "sinfo": [
            {
                "node": {"state": ["IDLE", "DRAIN"]},
                "nodes": {"nodes": ["gpu-5", "gpu-6"]},
                "reason": {"description": "autoheal: hot spare"},
                "partition": {"name": "batch"},
                "features": {"active": "pool_h100"},
            }
        ]
    }
    recs = slurm.parse_sinfo(data)
    assert set(recs) == {"gpu-5", "gpu-6"}
    assert recs["gpu-6"]["drained"] and recs["gpu-6"]["reason"] == "autoheal: hot spare"


def test_squeue_2205_and_newer_layouts_give_the_same_record():
    old = {
        "jobs": [
            {
                "job_id": 7,
                "job_state": "RUNNING",
                "nodes": "gpu-[1-2]",
                "requeue": True,
                "batch_flag": True,
                "restart_cnt": 0,
                "end_time": 100,
                "name": "train",
            }
        ]
    }
    new = {
        "jobs": [
            {
                "job_id": 7,
                "job_state": ["RUNNING"],
                "nodes": "gpu-[1-2]",
                "requeue": True,
                "batch_flag": True,
                "restart_cnt": 0,
                "end_time": {"set": True, "infinite": False, "number": 100},
                "name": "train",
            }
        ]
    }
    a, b = slurm.parse_squeue(old)[0], slurm.parse_squeue(new)[0]
    assert a == b
    assert a["state"] == "RUNNING" and a["nodes"] == ["gpu-1", "gpu-2"] and a["end_time"] == 100


def test_squeue_falls_back_to_job_resources_allocation():
    job = {
        "job_id": 9,
        "job_state": ["RUNNING"],
        "nodes": "",
        "job_resources": {"nodes": {"allocation": [{"name": "gpu-3"}, {"name": "gpu-4"}]}},
    }
    assert slurm.parse_squeue({"jobs": [job]})[0]["nodes"] == ["gpu-3", "gpu-4"]


@pytest.mark.parametrize(
    "bad", ["GPU-1", "gpu_1", "gpu-1;rm -rf /", "-gpu", "gpu-[1-3]", "a" * 64, "", "gpu-1\n", None, 7]
)
def test_node_name_grammar_rejects_hostile_names(bad):
    assert not validate.is_node_name(bad)


def test_sinfo_text_records_match_the_json_ones():
    """`sinfo -N -O` as captured from Slurm 22.05 (one line per node and partition)."""
    sep = slurm.SINFO_SEP
    lines = [
        sep.join(["gpu-7", "idle+drain", "h100", "pool_h100", "autoheal: replaces gpu-3 inc-1", "x y: z"]),
        sep.join(["gpu-7", "idle+drain", "batch*", "pool_h100", "autoheal: replaces gpu-3 inc-1", "x y: z"]),
        sep.join(["gpu-500", "unknown+not_responding", "batch*", "pool_h100", "(null)", "none"]),
        sep.join(["gpu-8", "down", "h100", "(null)", "(null)", "dead"]),
    ]
    got = slurm.parse_sinfo_text("\n".join(lines) + "\n")
    assert got["gpu-7"] == {
        "name": "gpu-7",
        "state": "idle",
        "flags": ["DRAIN"],
        "reason": "x y: z",
        "comment": "autoheal: replaces gpu-3 inc-1",
        "features": ["pool_h100"],
        "partitions": ["h100", "batch"],
        "drained": True,
        "down": False,
        "responding": True,
    }
    assert got["gpu-500"]["reason"] == "" and got["gpu-500"]["comment"] == ""
    assert not got["gpu-500"]["responding"] and got["gpu-500"]["state"] == "unknown"
    assert got["gpu-8"]["down"] and got["gpu-8"]["features"] == []
    fmt = slurm.SINFO_TEXT_FORMAT
    assert fmt.startswith("NodeList:0" + sep) and fmt.endswith(",Reason:0")


def _captured(name: str) -> dict:
    import json

    from tests.runbook.conftest import REPO

    data: dict = json.loads((REPO / "tests" / "data" / name).read_text())
    return data


class _FakeModule:
    """Just enough of AnsibleModule for Slurm.nodes(): commands answered from captured output."""

    def __init__(self, outputs: dict[str, str]) -> None:
        self.params: dict = {}
        self.outputs = outputs
        self.ran: list[list[str]] = []

    def get_bin_path(self, name: str, required: bool = False) -> str | None:
        return f"/usr/bin/{name}" if required else None

    def run_command(self, argv: list[str], **_: object) -> tuple[int, str, str]:
        self.ran.append(argv)
        key = " ".join(a.rsplit("/", 1)[-1] for a in argv[:3])
        return 0, self.outputs[key], ""

    def fail_json(self, **kw: object) -> None:
        raise AssertionError(kw)


def test_slurm_2411_groups_nodes_in_sinfo_json_so_each_nodes_reason_comes_from_scontrol():
    """Captured on the pods lab (Slurm 24.11.5): gpu-3 drained by a fence, gpu-2 and gpu-4 hot
    spares. `sinfo --json` puts the three in one group with the fence's reason; read that way,
    no spare is free (seen: "no spare" with a free spare). The nodes are read per node instead."""
    import json

    grouped = _captured("slurm-24.11-sinfo-json-grouped.json")
    per_node = _captured("slurm-24.11-scontrol-show-nodes-json.json")
    naive = slurm.parse_sinfo(grouped)
    assert {n: r["reason"] for n, r in naive.items()} == dict.fromkeys(
        ["gpu-2", "gpu-3", "gpu-4"], "autoheal: XID 79 gpu3 inc-0123456789ab"
    )  # what a group says: the reason of one of its nodes, for all of them
    module = _FakeModule({"sinfo --json": json.dumps(grouped), "scontrol show nodes": json.dumps(per_node)})
    reader = slurm.Slurm(module)
    nodes = reader.nodes()
    assert {n: r["reason"] for n, r in nodes.items()} == {
        "gpu-2": "autoheal: hot spare",
        "gpu-3": "autoheal: XID 79 gpu3 inc-0123456789ab",
        "gpu-4": "autoheal: hot spare",
    }
    assert all(r["drained"] and r["responding"] and r["features"] == ["pool_h100"] for r in nodes.values())
    assert nodes["gpu-2"]["partitions"] == ["batch", "h100"]
    reader.nodes()  # the layout is known now: straight to scontrol
    assert [a[1:3] for a in module.ran] == [["--json"], ["show", "nodes"], ["show", "nodes"]]


def test_jobs_asks_squeue_for_every_state_so_a_job_that_ended_at_its_sigterm_is_seen():
    """24.x `squeue --json` lists only the default states: a job that left at the fence's SIGTERM
    (it checkpointed, or died of it) was gone from the evacuation's listing, which then requeued
    nothing and journalled "no jobs" (seen on the pods lab, a dotted node, Slurm 24.11).
    `--states=all` lists it there as 22.05 always did; the callers pick the states they act on."""
    import json

    ended = {
        "job_id": 12,
        "job_state": ["COMPLETED"],
        "nodes": "ip-10-0-3-2.us-west-2.compute.internal",
        "requeue": True,
        "batch_flag": True,
        "restart_cnt": 0,
        "end_time": {"set": True, "infinite": False, "number": 100},
        "name": "wrap",
    }
    module = _FakeModule({"squeue --json --states=all": json.dumps({"jobs": [ended]})})
    jobs = slurm.Slurm(module).jobs()
    assert module.ran[0][1:] == ["--json", "--states=all"]
    assert [(j["job_id"], j["state"], j["nodes"]) for j in jobs] == [
        (12, "COMPLETED", ["ip-10-0-3-2.us-west-2.compute.internal"])
    ]
