"""The lender's reading of the cluster (remediation/lender.py), its config and the identity it
runs under. The moves on real kubelets with Slurm in pods: tests/k8s_slurm/test_lending.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoheal.labels import (
    LEND_LABEL,
    LEND_MOVED_ANNOTATION,
    POOL_LABEL,
    QUARANTINE_TAINT_KEY,
    QUARANTINED,
    SPARE_LABEL,
    STATE_LABEL,
)
from components.runner import RUNNER_RBAC_RULES, RemediationRunnerArgs, runner_settings
from remediation.config import LendingSettings, RunnerConfig, load_config
from remediation.cordon_sync import KubeNode, SlurmNode
from remediation.errors import RunnerConfigError
from remediation.lender import InferencePod, parse_jobs, parse_node, parse_pods, pod_gpus, pool_nodes
from remediation.lending import Job, LendState

REPO = Path(__file__).resolve().parents[2]


def _pod(
    name: str, pc: str = "inference", gpus: str | None = "1", node: str = "", phase: str = "Pending"
) -> Any:
    res = {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}
    spec: dict[str, Any] = {"priorityClassName": pc, "containers": [{"name": "c", "resources": res}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "web"}, "spec": spec, "status": {"phase": phase}}


def test_only_gpu_pods_of_the_inference_class_count_and_only_unbound_pending_ones_are_demand() -> None:
    pods = [
        _pod("a"),
        _pod("b", gpus="2", node="gpu-1", phase="Running"),
        _pod("c", node="gpu-1"),  # bound, not started yet: on the node, not demand
        _pod("d", pc="batch"),
        _pod("e", gpus=None),
        _pod("f", phase="Succeeded"),
    ]
    got = parse_pods(pods, "inference")
    assert got == [
        InferencePod("web", "a", "", 1, True),
        InferencePod("web", "b", "gpu-1", 2, False),
        InferencePod("web", "c", "gpu-1", 1, False),
    ]
    both = {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "2"}}}, {}]}}
    assert pod_gpus(both) == 2 and pod_gpus({"spec": {"containers": [{"resources": {"limits": {}}}]}}) == 0


def _node(name: str, labels: dict[str, str], moved: str | None = None, gpus: str = "4") -> dict[str, Any]:
    ann = {LEND_MOVED_ANNOTATION: moved} if moved is not None else {}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": ann},
        "spec": {},
        "status": {"capacity": {"nvidia.com/gpu": gpus}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_the_nodes_side_cooldown_and_gpus_come_from_the_node() -> None:
    v = parse_node(_node("gpu-1", {POOL_LABEL: "h100", LEND_LABEL: "lent"}, moved="1700000000"))
    assert (v.kube.name, v.gpus, v.moved_at) == ("gpu-1", 4, 1700000000.0)
    assert parse_node(_node("x", {}, moved="garbage")).moved_at == 0.0
    assert parse_node(_node("x", {})).moved_at is None


def test_pool_nodes_joins_kubernetes_slurm_and_the_inference_pods() -> None:
    views = [
        parse_node(_node("gpu-1", {POOL_LABEL: "h100"})),
        parse_node(_node("gpu-2", {POOL_LABEL: "h100", LEND_LABEL: "lent"})),
        parse_node(_node("gpu-3", {POOL_LABEL: "h100", STATE_LABEL: "spare", SPARE_LABEL: "true"})),
        parse_node(_node("cpu-1", {})),  # no pool: not a candidate, not listed
    ]
    slurm = {"gpu-1": SlurmNode("gpu-1", False, "", busy=True), "gpu-3": SlurmNode("gpu-3", True, "x")}
    pods = [InferencePod("web", "p", "gpu-2", 4, False)]
    asked: list[str] = []

    def jobs(node: str) -> tuple[Job, ...]:
        asked.append(node)
        return (Job("9", 3),)

    got = {n.name: n for n in pool_nodes(views, pods, slurm, jobs, "autoheal.io/opt-out")}
    assert sorted(got) == ["gpu-1", "gpu-2", "gpu-3"] and asked == ["gpu-1"]  # only busy training nodes
    assert got["gpu-1"].busy and got["gpu-1"].jobs == (Job("9", 3),) and got["gpu-1"].eligible
    assert got["gpu-2"].state is LendState.LENT and not got["gpu-2"].in_slurm
    assert (got["gpu-2"].inference_gpus, got["gpu-2"].inference_pods) == (4, 1)
    assert not got["gpu-3"].eligible


def test_the_jobs_on_a_node_are_read_with_their_state_and_a_comment_that_holds_the_separator() -> None:
    out = "12|500|R|checkpoint=1700000000\n13|7|CG|a|b checkpoint=5\n\n"
    assert parse_jobs(out) == (Job("12", 500, 1700000000.0, False), Job("13", 7, 5.0, True))


def test_a_node_the_runbook_fenced_is_held_by_its_label_or_its_taint() -> None:
    taint = {"key": QUARANTINE_TAINT_KEY, "value": "replace", "effect": "NoSchedule"}
    by_label = _node("gpu-1", {POOL_LABEL: "h100", LEND_LABEL: "lent", STATE_LABEL: QUARANTINED})
    by_taint = _node("gpu-2", {POOL_LABEL: "h100", LEND_LABEL: "lent"})
    by_taint["spec"] = {"taints": [taint], "unschedulable": True}
    cordoned = _node("gpu-3", {POOL_LABEL: "h100", LEND_LABEL: "returning"})
    cordoned["spec"] = {"unschedulable": True}  # the lender's own cordon: not a fence
    views = [parse_node(n) for n in (by_label, by_taint, cordoned)]
    got = {n.name: n.fenced for n in pool_nodes(views, [], {}, lambda _n: (), "autoheal.io/opt-out")}
    assert got == {"gpu-1": True, "gpu-2": True, "gpu-3": False}


def test_a_lent_node_is_left_to_the_lender_by_the_cordon_sync() -> None:
    k = KubeNode("gpu-1", unschedulable=True, labels={LEND_LABEL: "returning"})
    assert k.owned_by_runbook()


def _write(tmp_path: Path, lending: dict[str, Any]) -> Path:
    doc = yaml.safe_load((REPO / "config/runner.yaml").read_text())
    doc["lending"] = {**doc["lending"], **lending}
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_shipped_config_has_lending_off_and_valid(tmp_path: Path) -> None:
    cfg: RunnerConfig = load_config(_write(tmp_path, {}))
    assert cfg.lending == LendingSettings()


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"max_percent": 150}, "lending.max_percent"),
        ({"on_grace": "kill"}, "lending.on_grace"),
        ({"order": ["priority", "age"]}, "lending.order"),
        ({"priority_class": "Not A Class"}, "lending.priority_class"),
        ({"pools": ["h100", "bad pool"]}, "lending.pools"),
        ({"max_nodes": -1}, "lending.max_nodes"),
        ({"surprise": 1}, "lending.surprise"),
    ],
)
def test_bad_lending_config_names_the_field(tmp_path: Path, bad: dict[str, Any], field: str) -> None:
    with pytest.raises(RunnerConfigError, match=field.replace(".", r"\.")):
        load_config(_write(tmp_path, bad))


def test_the_runners_cluster_role_covers_every_call_the_lender_makes() -> None:
    granted = {(g, r, v) for gs, rs, vs in RUNNER_RBAC_RULES for g in gs for r in rs for v in vs}
    needs = {
        ("", "nodes", "list"),  # views
        ("", "nodes", "patch"),  # label, moved-at, cordon
        ("", "pods", "list"),  # the inference pods, every namespace
        ("", "pods/eviction", "create"),  # a returning node's pods
    }
    assert needs <= granted
    # its Events go where the runner's events Role is
    settings = runner_settings(RemediationRunnerArgs(namespace="autoheal", event_namespace="audit"))
    assert settings["lending"]["event_namespace"] == "audit"
