"""The recovery ladder's production backend on real kubelets: the GPU reset and DCGM validation run
as Jobs (autoheal.cluster.node_job) with the runner's ServiceAccount and RBAC exactly as
components/runner.py declares them, from an image whose nvidia-smi and dcgmi are scripts
(images/fake_gpu.py) that succeed, fail or hang by the incident id's last words.

Each round runs the ladder's reset then validation (roles/ladder) for both nodes at once, one
scenario per node, and checks each node's outcome as the incident journal records it:

    ok             reset ok -> validated (the GPU agents come back)
    reset-fails    reset failed: "Failed exit 3: Unable to reset GPU ..." -> no validation
    reset-hangs    reset failed: DeadlineExceeded (the Job stopped at ladder_reset_timeout)
    diag-fails     reset ok (one GPU: not an NVSwitch product) -> validation failed: "Memory on GPU 0: Fail"
    busy           reset refused naming the user's pod that holds a GPU
    lost GPU       reset ok -> validation Pending (3 of 4 GPUs allocatable) -> failed past pending_timeout
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autoheal import labels as lb
from images.build import build
from lab import controlplane
from lab.nodes import cluster, node
from tests.nodes.conftest import Cluster, pod_spec, unique
from tests.runbook.conftest import REPO, VENV_BIN, ansible_env, run_module
from tests.support import wait_for

NS = "autoheal"
SA = "autoheal-runner"
NODES = ["rn-1", "rn-2"]
AGENT_LABELS = {lb.COMPONENT_LABEL: "gpu-metrics", lb.PART_OF_LABEL: "autoheal", "test": "fake-agent"}

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
  tasks:
    - name: GPU reset
      ansible.builtin.include_role: {name: ladder, tasks_from: reset}
      vars: {ladder_nodes: "{{ batch }}"}
    - name: Validate what the reset fixed
      ansible.builtin.include_role: {name: ladder, tasks_from: validate}
      vars: {ladder_nodes: "{{ ladder_reset_ok }}"}
      when: ladder_reset_ok | length > 0
    - name: What the ladder decided
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ {'reset_ok': ladder_reset_ok, 'reset_failed': ladder_reset_failed,
                      'passed': ladder_passed | default([]), 'failed': ladder_failed | default({}),
                      'reset_jobs': (ladder_reset_all.node_results | default({}))
                                    | combine(ladder_reset_one.node_results | default({}))} | to_json }}"
"""


def kubectl(c: Cluster, *args: str, stdin: str | None = None) -> str:
    res = subprocess.run(
        [str(controlplane.tool_path("kubectl")), "--kubeconfig", str(c.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def runner_kubeconfig(c: Cluster, path: Path) -> Path:
    """Apply the runner's RBAC as its component declares it; a kubeconfig with its SA's token."""
    from tests.k8s_runner.conftest import runner_rbac_objects

    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    kubectl(c, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [ns]}))
    objects = runner_rbac_objects()
    kubectl(c, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    r = c.http.post(
        f"/api/v1/namespaces/{NS}/serviceaccounts/{SA}/token",
        json={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert r.status_code == 201, r.text
    cfg = yaml.safe_load(c.kubeconfig.read_text())
    cfg["users"] = [{"name": "runner", "user": {"token": r.json()["status"]["token"]}}]
    cfg["contexts"][0]["context"]["user"] = "runner"
    path.write_text(yaml.safe_dump(cfg))
    return path


def fake_agents(c: Cluster) -> None:
    """A DaemonSet standing in for dcgm-exporter: on every GPU node whose agents are not stopped."""
    away = {"key": lb.GPU_AGENTS_LABEL, "operator": "NotIn", "values": [lb.GPU_AGENTS_STOPPED]}
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "fake-dcgm-exporter", "namespace": NS},
        "spec": {
            "selector": {"matchLabels": AGENT_LABELS},
            "template": {
                "metadata": {"labels": AGENT_LABELS},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [away]}]
                            }
                        }
                    },
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "agent", "image": c.image("pause")}],
                },
            },
        },
    }
    kubectl(c, "apply", "-f", "-", stdin=json.dumps(ds))


def agents_on(c: Cluster) -> set[str]:
    r = c.http.get(f"/api/v1/namespaces/{NS}/pods", params={"labelSelector": "test=fake-agent"})
    r.raise_for_status()
    return {
        p["spec"].get("nodeName")
        for p in r.json()["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


@pytest.fixture(scope="module")
def ladder(real_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    c = real_cluster
    tools = build(["fake-gpu-tools"])[0]
    for name in NODES:
        node.import_image(c.ctx, cluster.spec(c.run_dir, name), tools)
    work = tmp_path_factory.mktemp("ladderjobs")
    env = {"kubeconfig": runner_kubeconfig(c, work / "runner.kubeconfig"), "image": tools.ref, "work": work}
    fake_agents(c)
    wait_for(lambda: agents_on(c) == set(NODES), 90, "the fake GPU agents on both nodes")
    yield env
    kubectl(c, "delete", "namespace", NS, "--wait=false")
    for name in NODES:
        kubectl(c, "label", "node", name, f"{lb.GPU_AGENTS_LABEL}-", "nvidia.com/gpu.product-")
        kubectl(c, "annotate", "node", name, f"{lb.VALIDATION_ANNOTATION}-")
    (c.run_dir / "simulator.json").write_text(json.dumps({"nodes": {}, "xids": []}))


def run_ladder(env: dict[str, Any], name: str, incidents: dict[str, str], **extra: Any) -> dict[str, Any]:
    """One ladder run (reset, then validation of what reset) for the nodes of `incidents` at once."""
    work: Path = env["work"]
    play, out, journal = work / f"{name}.yml", work / f"{name}.json", work / f"{name}.events.jsonl"
    play.write_text(PLAY)
    extra_vars = {
        "batch": list(incidents),
        "out": str(out),
        "ladder_backend": "dcgm",
        "ladder_incidents": incidents,
        "ladder_kubeconfig": str(env["kubeconfig"]),
        "ladder_dcgm_image": env["image"],
        "ladder_journal": str(journal),
        "ladder_dcgm_level": 1,
        "ladder_agents_timeout": 60,
        **extra,
    }
    res = subprocess.run(
        [str(VENV_BIN / "ansible-playbook"), str(play), "-e", json.dumps(extra_vars)],
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    got: dict[str, Any] = json.loads(out.read_text())
    got["events"] = (
        [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []
    )
    for e in got["events"]:  # the ladder's table, in the test's output (-s)
        print(
            f"[ladder {name}] {e['node']} {e['incident']} {e['phase']} {e['status']}: {e.get('detail', '')[:200]}"
        )
    return got


def event(got: dict[str, Any], node: str, phase: str) -> dict[str, Any]:
    found = [e for e in got["events"] if e.get("node") == node and e.get("phase") == phase]
    assert len(found) == 1, (node, phase, got["events"])
    return found[0]


def test_reset_ok_validates_and_a_failed_reset_climbs_naming_the_exit(
    real_cluster: Cluster, ladder: dict[str, Any]
) -> None:
    got = run_ladder(ladder, "r1", {"rn-1": "inc-r1-ok", "rn-2": "inc-r1-reset-fails"})
    assert got["reset_ok"] == ["rn-1"] and got["passed"] == ["rn-1"], got
    assert event(got, "rn-1", "gpu_reset")["status"] == "ok"
    assert event(got, "rn-1", "validated")["status"] == "ok"
    failed = event(got, "rn-2", "gpu_reset")
    assert failed["status"] == "failed" and "Failed exit 3: Unable to reset GPU" in failed["detail"], failed
    # every GPU of the node together: no product label says otherwise (NVSwitch systems)
    assert "nvidia-smi --gpu-reset\n" in got["reset_jobs"]["rn-1"]["logs"], got["reset_jobs"]
    annotations = real_cluster.node("rn-1")["metadata"]["annotations"]
    assert annotations[lb.VALIDATION_ANNOTATION] == "passed"
    # the GPU agents came back where validation passed; stay stopped where the rung failed
    wait_for(lambda: agents_on(real_cluster) == {"rn-1"}, 60, "the agents back on rn-1 only")
    assert real_cluster.node("rn-2")["metadata"]["labels"][lb.GPU_AGENTS_LABEL] == lb.GPU_AGENTS_STOPPED


def test_a_hung_reset_times_out_and_a_failed_diagnostic_fails_validation(
    real_cluster: Cluster, ladder: dict[str, Any]
) -> None:
    # rn-2 is no NVSwitch system: its named GPU alone is reset
    kubectl(real_cluster, "label", "node", "rn-2", "--overwrite", "nvidia.com/gpu.product=NVIDIA-L40S")
    got = run_ladder(
        ladder,
        "r2",
        {"rn-1": "inc-r2-reset-hangs", "rn-2": "inc-r2-diag-fails"},
        ladder_reset_timeout=15,
        ladder_gpu=2,
    )
    hung = event(got, "rn-1", "gpu_reset")
    assert hung["status"] == "failed" and "DeadlineExceeded: " in hung["detail"], hung
    assert "nvidia-smi --gpu-reset -i 2\n" in got["reset_jobs"]["rn-2"]["logs"], got["reset_jobs"]
    assert got["reset_ok"] == ["rn-2"] and got["passed"] == [], got
    diag = event(got, "rn-2", "validated")
    assert diag["status"] == "failed" and "Memory on GPU 0: Fail" in diag["detail"], diag
    assert real_cluster.node("rn-2")["metadata"]["annotations"][lb.VALIDATION_ANNOTATION] == "failed"


def test_a_busy_gpu_is_refused_and_gpus_that_cannot_be_allocated_fail_validation(
    real_cluster: Cluster, ladder: dict[str, Any]
) -> None:
    busy = unique("busy")
    spec = pod_spec(busy, real_cluster.image("pause"), ["/usr/bin/catatonit", "-P"], "rn-1")
    spec["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    real_cluster.create(spec)
    real_cluster.wait_phase(busy, {"Running"})
    # GPU 3 of rn-2 falls off the bus: the device plugin marks it unhealthy, 3 of 4 allocatable
    (real_cluster.run_dir / "simulator.json").write_text(
        json.dumps({"nodes": {}, "xids": [], "lost": [["rn-2", 3]]})
    )
    wait_for(
        lambda: real_cluster.node("rn-2")["status"]["allocatable"].get("nvidia.com/gpu") == "3",
        60,
        "rn-2 allocatable 3",
    )
    try:
        got = run_ladder(
            ladder, "r3", {"rn-1": "inc-r3-busy", "rn-2": "inc-r3-lost"}, ladder_pending_timeout=10
        )
    finally:
        real_cluster.http.delete(f"/api/v1/namespaces/default/pods/{busy}")
        (real_cluster.run_dir / "simulator.json").write_text(json.dumps({"nodes": {}, "xids": []}))
        # the package's lab is shared: the next test (the preflight's GPU row) must find 4 again
        wait_for(
            lambda: real_cluster.node("rn-2")["status"]["allocatable"].get("nvidia.com/gpu") == "4",
            60,
            "rn-2 allocatable 4 again",
        )
    refused = event(got, "rn-1", "gpu_reset")
    assert (
        refused["status"] == "failed"
        and f"refused: the GPUs are in use by default/{busy}" in refused["detail"]
    )
    lost = event(got, "rn-2", "validated")
    assert lost["status"] == "failed" and "Pending" in lost["detail"], lost
    assert "Insufficient nvidia.com/gpu" in lost["detail"], lost


def test_forbidden_rerun_and_check_mode_as_the_runner(real_cluster: Cluster, ladder: dict[str, Any]) -> None:
    base = {
        "nodes": ["rn-2"],
        "purpose": "reset",
        "image": ladder["image"],
        "command": ["nvidia-smi", "--gpu-reset"],
        "kubeconfig": str(ladder["kubeconfig"]),
        "timeout": 30,
    }
    # outside the runner's namespace the API server says no: a failed node naming it, not a crash
    out = run_module("node_job", {**base, "namespace": "default", "incidents": {"rn-2": "inc-x"}})
    assert not out["failed"] and out["ok_nodes"] == [], out
    reason = out["node_results"]["rn-2"]["reason"]
    assert reason.startswith("Forbidden: jobs.batch") and f"system:serviceaccount:{NS}:{SA}" in reason, out
    # the same node and incident again: the kept failed Job is read, not run again
    again = run_module("node_job", {**base, "incidents": {"rn-2": "inc-r1-reset-fails"}})
    assert not again["changed"] and again["failed_nodes"]["rn-2"].startswith("Failed exit 3"), again
    # check mode creates nothing
    dry = run_module("node_job", {**base, "incidents": {"rn-2": "inc-dry"}}, check=True)
    assert dry["changed"] and dry["node_results"]["rn-2"]["reason"].startswith("check mode"), dry
    name = dry["node_results"]["rn-2"]["job"]
    assert real_cluster.http.get(f"/apis/batch/v1/namespaces/{NS}/jobs/{name}").status_code == 404
