"""The lab's real control plane with KWOK GPU nodes answers as Kubernetes does.

One control plane for the module (started in a temporary dir, always stopped). Pods bound to
KWOK nodes are "run" by KWOK's stages: Running once scheduled, gone once deleted.
"""

from __future__ import annotations

import json
import socket
import uuid
from typing import Any

import pytest

from autoheal import proc
from lab import controlplane
from tests.support import port_base, processes_pointing_into, wait_for

pytestmark = pytest.mark.kube

PORT_BASE = port_base(27200)
GPU_NODES = [f"gpu-{i:02d}" for i in range(4)]
TAINTED = "gpu-tainted"


@pytest.fixture(scope="module")
def cp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("kube")
    specs = [controlplane.KubeNodeSpec(n, labels={"autoheal.io/pool": "a"}, taints=[]) for n in GPU_NODES]
    specs.append(
        controlplane.KubeNodeSpec(
            TAINTED,
            labels={"autoheal.io/pool": "quarantine"},
            taints=[{"key": "autoheal.io/quarantine", "value": "true", "effect": "NoSchedule"}],
        )
    )
    try:
        yield controlplane.start_control_plane(run_dir, specs, PORT_BASE, timeout=180)
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture(scope="module")
def api(cp):
    client = controlplane.api_client(cp.kubeconfig)
    yield client
    client.close()


@pytest.fixture
def core(api):
    from kubernetes.client import CoreV1Api

    return CoreV1Api(api)


def pod_manifest(
    name: str,
    gpus: int = 1,
    labels: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": node_selector or {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            "containers": [
                {
                    "name": "train",
                    "image": "trainer:latest",
                    "resources": {
                        "requests": {"nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


def running_pod(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, "default")
    return pod if pod.status.phase == "Running" else None


def pod_gone(core: Any, name: str) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespaced_pod(name, "default")
    except ApiException as exc:
        return bool(exc.status == 404)
    return False


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_every_service_is_healthy_and_has_a_pid_file(cp):
    status = controlplane.control_plane_status(cp.run_dir)
    assert status == dict.fromkeys(controlplane.SERVICES, True)
    assert set(cp.pids) == set(controlplane.SERVICES)
    for service, pid in cp.pids.items():
        data = json.loads((cp.run_dir / "pids" / f"{service}.json").read_text())
        assert data["pid"] == pid
        assert data["start_ticks"] == proc.start_ticks(pid)  # a recycled PID is never signalled
        assert (cp.run_dir / "logs" / f"{service}.log").exists()


def test_kwok_nodes_are_ready_with_labels_taints_and_gpu_capacity(core):
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {*GPU_NODES, TAINTED}
    for name, node in nodes.items():
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", name
    assert nodes["gpu-00"].metadata.labels["autoheal.io/pool"] == "a"
    taints = [(t.key, t.value, t.effect) for t in nodes[TAINTED].spec.taints or []]
    assert ("autoheal.io/quarantine", "true", "NoSchedule") in taints


def test_cordon_through_the_api_is_visible_and_reversible(core):
    core.patch_node("gpu-03", {"spec": {"unschedulable": True}})
    assert core.read_node("gpu-03").spec.unschedulable is True  # visible at once

    def taints() -> set[str]:
        return {t.key for t in core.read_node("gpu-03").spec.taints or []}

    # The node lifecycle controller then adds the matching taint, asynchronously.
    wait_for(lambda: "node.kubernetes.io/unschedulable" in taints(), 30, "the unschedulable taint")
    core.patch_node("gpu-03", {"spec": {"unschedulable": False}})
    assert not core.read_node("gpu-03").spec.unschedulable
    wait_for(lambda: "node.kubernetes.io/unschedulable" not in taints(), 30, "the taint to go")


def test_scheduler_binds_a_gpu_pod_to_a_kwok_node_with_capacity(core):
    name = uid("train")
    core.create_namespaced_pod("default", pod_manifest(name, gpus=8))
    try:
        pod = wait_for(lambda: running_pod(core, name), 60, f"{name} Running")
        assert pod.spec.node_name in GPU_NODES  # never the tainted node
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_pod_asking_for_more_gpus_than_any_node_has_stays_pending(core):
    name = uid("toobig")
    core.create_namespaced_pod("default", pod_manifest(name, gpus=9))
    try:

        def unschedulable():
            pod = core.read_namespaced_pod(name, "default")
            conds = pod.status.conditions or []
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)

        wait_for(unschedulable, 60, f"{name} Unschedulable")
        assert core.read_namespaced_pod(name, "default").spec.node_name is None
    finally:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def evict(core: Any, name: str) -> Any:
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": "default"},
    }
    return core.create_namespaced_pod_eviction(name, "default", body)


def test_evicting_a_pod_bound_to_a_kwok_node_completes(core):
    name = uid("evictme")
    core.create_namespaced_pod("default", pod_manifest(name, gpus=1))
    wait_for(lambda: running_pod(core, name), 60, f"{name} Running")
    evict(core, name)
    wait_for(lambda: pod_gone(core, name), 60, f"{name} deleted after eviction")


def test_a_pod_disruption_budget_makes_eviction_answer_429(api, core):
    from kubernetes.client import PolicyV1Api
    from kubernetes.client.exceptions import ApiException

    policy: Any = PolicyV1Api(api)
    app = uid("guarded")
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": app},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
    }
    policy.create_namespaced_pod_disruption_budget("default", pdb)
    name = f"{app}-0"
    core.create_namespaced_pod("default", pod_manifest(name, labels={"app": app}))
    try:
        wait_for(lambda: running_pod(core, name), 60, f"{name} Running")

        def budget_counts_the_pod():
            st = policy.read_namespaced_pod_disruption_budget(app, "default").status
            return st is not None and st.current_healthy == 1 and st.disruptions_allowed == 0

        wait_for(budget_counts_the_pod, 60, "the disruption controller to count the pod")
        with pytest.raises(ApiException) as err:
            evict(core, name)
        assert err.value.status == 429
        assert running_pod(core, name)
    finally:
        policy.delete_namespaced_pod_disruption_budget(app, "default")
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_deleted_node_disappears_and_added_node_becomes_ready(cp, core):
    controlplane.add_nodes(
        cp, [controlplane.KubeNodeSpec("gpu-late", labels={}, taints=[], gpus=4)], timeout=60
    )
    assert core.read_node("gpu-late").status.allocatable["nvidia.com/gpu"] == "4"
    controlplane.delete_node(cp, "gpu-late")
    wait_for(
        lambda: "gpu-late" not in {n.metadata.name for n in core.list_node().items},
        30,
        "gpu-late deleted",
    )
    controlplane.delete_node(cp, "gpu-late")  # already gone: no error


def test_a_service_failing_at_start_is_named_and_nothing_is_left_running(tmp_path, monkeypatch):
    real_argv = controlplane._argv

    def broken_controller_manager(run_dir, ports, *rest):
        argv = real_argv(run_dir, ports, *rest)
        argv["kube-controller-manager"].append("--no-such-flag")
        return argv

    monkeypatch.setattr(controlplane, "_argv", broken_controller_manager)
    with pytest.raises(controlplane.ControlPlaneError) as err:
        controlplane.start_control_plane(tmp_path, [], PORT_BASE + 50, timeout=60)
    assert err.value.service == "kube-controller-manager"
    assert "exited with code" in err.value.cause
    assert err.value.log == tmp_path / "logs" / "kube-controller-manager.log"
    assert "unknown flag: --no-such-flag" in str(err.value)  # the log's tail is in the message
    assert (tmp_path / "logs" / "kube-apiserver.log").read_text()  # others had started...
    assert processes_pointing_into(tmp_path) == {}  # ...and were all stopped again
    assert not list((tmp_path / "pids").glob("*.json"))
    assert controlplane.control_plane_status(tmp_path) == dict.fromkeys(controlplane.SERVICES, False)


def test_a_taken_port_is_reported_before_anything_starts(tmp_path):
    base = PORT_BASE + 60
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", controlplane.Ports.from_base(base).apiserver))
        blocker.listen()
        with pytest.raises(controlplane.ControlPlaneError) as err:
            controlplane.start_control_plane(tmp_path, [], base, timeout=60)
    assert err.value.service == "kube-apiserver"
    assert f"127.0.0.1:{base + 2} is already in use" in str(err.value)
    assert not (tmp_path / "logs" / "etcd.log").exists()


def test_stop_is_a_no_op_without_a_control_plane(tmp_path):
    controlplane.stop_control_plane(tmp_path)
    controlplane.stop_control_plane(tmp_path / "never-created")
