"""The schedulability proof (lab.schedulable): each example stack's declared objects on a real API
server, KWOK nodes shaped like the nodes the stack asks for, the real kube-scheduler deciding.

The EKS example must come up as declared: every pod binds, on the nodes meant for it. A stack
broken the three ways a real cluster breaks (no node for system pods, no device plugin, a claim's
StorageClass missing) fails naming each pod and the scheduler's reason.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autoheal import labels as lb
from lab import controlplane, schedulable
from review.mockstack import dump, run_project
from tests.support import port_base

ROOT = Path(__file__).resolve().parents[2]
PORT_BASE = port_base(27650)  # the proof's control plane: +0..+5

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    for tool in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kubectl"):
        try:
            controlplane.tool_path(tool)
        except controlplane.ToolMissingError as exc:
            pytest.skip(f"SCHEDULABILITY NOT PROVEN: {exc}")


@pytest.fixture(scope="module")
def eks_rows() -> list[dict[str, Any]]:
    return dump(run_project(ROOT, "example-eks"))


def test_the_eks_examples_nodes_are_shaped_like_its_node_groups(eks_rows):
    shapes = {s.name: s for s in schedulable.node_shapes(eks_rows)}
    h100 = shapes["autoheal-h100"]
    assert (h100.count, shapes["autoheal-h100-spare"].count) == (16, 2)
    assert h100.capacity == {"cpu": "192", "memory": "2048Gi", "pods": "100"}
    assert h100.devices == {lb.GPU_RESOURCE: 8, "vpc.amazonaws.com/efa": 32}
    assert {"key": lb.GPU_RESOURCE, "value": "present", "effect": "NoSchedule"} in h100.taints
    spare = shapes["autoheal-h100-spare"]
    assert spare.labels[lb.SPARE_LABEL] == "true" and lb.spare_taint() in spare.taints
    system = [s for s in shapes.values() if not s.devices]
    assert system and all(not s.taints for s in system), "a node group without taints for system pods"


def test_the_eks_example_schedules_every_pod_on_the_nodes_meant_for_it(eks_rows, tmp_path):
    report = schedulable.prove(eks_rows, tmp_path / "cluster", PORT_BASE)
    assert report.ok, report.text()
    assert report.pods_bound == report.pods_total > 0
    # what it could not prove is said, not passed over
    assert any("monitoring.coreos.com" in n for n in report.notes)


def test_a_stack_without_system_nodes_device_plugin_or_storage_class_fails_naming_each_pod(
    eks_rows, tmp_path
):
    """The three ways the EKS stack used not to come up, as the scheduler reports them."""
    system_groups = [
        r["name"]
        for r in eks_rows
        if r["type"] == schedulable.NODE_GROUP and not (r["inputs"].get("taints") or [])
    ]
    assert system_groups

    def broken(r: dict[str, Any]) -> bool:
        meta = r["inputs"].get("metadata") or {}
        return (
            r["name"] in system_groups
            or lb.ADVERTISES_ANNOTATION in (meta.get("annotations") or {})
            or (r["type"] == "kubernetes:storage.k8s.io/v1:StorageClass" and meta.get("name") == "gp3")
        )

    invalid = {  # and an object the API server refuses
        "type": "kubernetes:core/v1:ConfigMap",
        "name": "bad",
        "custom": True,
        "inputs": {"metadata": {"name": "Not_A_DNS_Name", "namespace": "autoheal"}, "data": {}},
    }
    rows = [*(r for r in eks_rows if not broken(r)), invalid]
    report = schedulable.prove(rows, tmp_path / "cluster", PORT_BASE)
    assert not report.ok
    by_object = {f.object: f for f in report.findings}
    assert any(f.kind == "claim" and "'gp3' is declared neither" in f.problem for f in report.findings), (
        report.text()
    )
    refused = by_object["ConfigMap autoheal/Not_A_DNS_Name"]
    assert refused.kind == "apply" and "RFC 1123" in refused.problem, refused
    login = next(f for o, f in by_object.items() if o.startswith("slurm/slurm-login-"))
    assert "untolerated taint" in login.problem, login
    slurmd = [f for o, f in by_object.items() if o.startswith("slurm/slurmd-")]
    assert slurmd and all("Insufficient nvidia.com/gpu" in f.problem for f in slurmd), report.text()


def test_the_lab_stack_proves_schedulable_through_the_cli_with_its_assumptions_named():
    res = subprocess.run(
        [
            str(Path(sys.executable).with_name("autoheal")),
            "lab",
            "schedulable",
            "--stack",
            "lab",
            "--project",
            str(ROOT),
            "--port-base",
            str(PORT_BASE),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and report["pods"]["bound"] == report["pods"]["total"] > 0
    assert any("preflight" in n for n in report["notes"])  # what an existing cluster must have
    with socket.socket() as sock:  # the proof's control plane is gone with it
        assert sock.connect_ex(("127.0.0.1", PORT_BASE + 2)) != 0
