"""The pure parts of the slurmd rollout (issue 33): which slurmd pods are on an old DaemonSet
revision, and the rollout play's optional node list. The play itself runs against real Slurm in
real pods in tests/k8s_slurm/test_slurm_rollout.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.runbook.conftest import plugin

pods_mod = plugin("modules.slurmd_pods")
inputs = plugin("plugin_utils.runbook_inputs")


def _rev(ds_uid: str, number: int, label: str) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {"controller-revision-hash": label},
            "ownerReferences": [{"kind": "DaemonSet", "uid": ds_uid, "name": f"ds-{ds_uid}"}],
        },
        "revision": number,
    }


def _pod(name: str, node: str, ds_uid: str, label: str, ready: bool = True, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {"controller-revision-hash": label},
            "ownerReferences": [{"kind": "DaemonSet", "uid": ds_uid, "name": f"ds-{ds_uid}"}],
            **meta,
        },
        "spec": {"nodeName": node},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_newest_revision_of_each_daemonset_is_current():
    revs = [_rev("a", 1, "a1"), _rev("a", 3, "a3"), _rev("a", 2, "a2"), _rev("b", 1, "b1")]
    assert pods_mod.newest_revisions(revs) == {"a": "a3", "b": "b1"}


def test_a_pod_on_an_older_revision_is_stale_and_one_being_deleted_is_left_out():
    current = {"a": "a3", "b": "b1"}
    pods = [
        _pod("p1", "ip-10-0-3-17.us-west-2.compute.internal", "a", "a2"),
        _pod("p2", "gpu-2", "a", "a3", ready=False),
        _pod("p3", "gpu-3", "b", "b1"),
        _pod("p4", "gpu-4", "a", "a2", deletionTimestamp="2026-12-03T00:00:00Z"),
        _pod("p5", "", "a", "a2"),  # not scheduled yet
    ]
    out = pods_mod.pod_records(pods, current)
    assert sorted(out) == ["gpu-2", "gpu-3", "ip-10-0-3-17.us-west-2.compute.internal"]
    assert out["ip-10-0-3-17.us-west-2.compute.internal"]["stale"] is True
    assert out["gpu-2"] == {
        "pod": "p2",
        "daemonset": "ds-a",
        "revision": "a3",
        "current": "a3",
        "stale": False,
        "ready": False,
    }
    assert out["gpu-3"]["stale"] is False


SPEC = {
    "autoheal_nodes": {"type": "list", "elements": "str", "default": []},
    "autoheal_kubeconfig": {"type": "path", "default": ""},
}


def test_the_rollout_may_name_no_node_but_every_name_it_gets_is_checked(tmp_path):
    run = inputs.check_inputs(SPEC, {}, str(tmp_path), str(tmp_path), {})
    assert run["nodes"] == []
    run = inputs.check_inputs(
        SPEC, {"autoheal_nodes": ["ip-10-0-3-17.us-west-2.compute.internal"]}, str(tmp_path), "", {}
    )
    assert run["nodes"] == ["ip-10-0-3-17.us-west-2.compute.internal"]
    with pytest.raises(inputs.InputError, match="autoheal_nodes"):
        inputs.check_inputs(SPEC, {"autoheal_nodes": ["Bad_Name"]}, str(tmp_path), "", {})
    # a play whose spec requires nodes still refuses an empty list
    required = {**SPEC, "autoheal_nodes": {"type": "list", "elements": "str", "required": True}}
    with pytest.raises(inputs.InputError, match="give at least one node"):
        inputs.check_inputs(required, {"autoheal_nodes": []}, str(tmp_path), "", {})
