"""`autoheal preflight` against a real control plane missing each prerequisite in turn.

One control plane for the module (KWOK nodes: three of pool h100, tainted and advertising 8 GPUs,
and one untainted system node), with a default StorageClass and the Prometheus Operator's CRDs and
a Prometheus object. Each test takes one thing away (the GPUs, the StorageClass, every untainted
node, a CRD, a recent kubelet), asserts the failure it names and its fix, and puts it back.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import StackSpec, parse_stack_config
from components.preflight import Report, preflight
from lab import controlplane
from tests.support import port_base, wait_for

pytestmark = pytest.mark.kube

PORT_BASE = port_base(28100)
ROOT = Path(__file__).resolve().parents[2]
AUTOHEAL = Path(sys.executable).parent / "autoheal"
POOL = [f"gpu-{i}" for i in (1, 2, 3)]
SYSTEM = "sys-1"
KUBELET = "v1.36.3"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
PRODUCT = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
CRDS = ("prometheusrules", "servicemonitors", "alertmanagerconfigs", "prometheuses", "alertmanagers")
KINDS = {
    "prometheusrules": "PrometheusRule",
    "servicemonitors": "ServiceMonitor",
    "alertmanagerconfigs": "AlertmanagerConfig",
    "prometheuses": "Prometheus",
    "alertmanagers": "Alertmanager",
}
SELECT_RELEASE = {"matchLabels": {"release": "kps"}}


def _crd(plural: str) -> dict[str, Any]:
    version = "v1alpha1" if plural == "alertmanagerconfigs" else "v1"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": KINDS[plural]},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def _node(name: str, pool: bool) -> dict[str, Any]:
    spec = controlplane.KubeNodeSpec(
        name,
        labels={"autoheal.io/pool": "h100", **PRODUCT} if pool else {"role": "system"},
        taints=[GPU_TAINT] if pool else [],
        gpus=8 if pool else 0,
    )
    manifest = controlplane.node_manifest(spec)
    # a kubelet's version, as a real node reports it (KWOK's initialize stage keeps what is set)
    manifest["status"]["nodeInfo"] = {"kubeletVersion": KUBELET, "kernelVersion": "6.8.0-test"}
    return manifest


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.KubeHandle]:
    run_dir = tmp_path_factory.mktemp("preflight")
    try:
        handle = controlplane.start_control_plane(run_dir, [], PORT_BASE, timeout=180)
        with controlplane.http_client(handle.kubeconfig, pool=2) as http:
            for name in [*POOL, SYSTEM]:
                r = http.post("/api/v1/nodes", json=_node(name, name != SYSTEM))
                assert r.status_code == 201, r.text
            r = http.post("/apis/storage.k8s.io/v1/storageclasses", json=_storage_class())
            assert r.status_code == 201, r.text
            for plural in CRDS:
                _create_crd(http, plural)
            prom = {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "Prometheus",
                "metadata": {"name": "k8s", "namespace": "default"},
                "spec": {
                    "ruleSelector": SELECT_RELEASE,
                    "ruleNamespaceSelector": {},
                    "serviceMonitorSelector": SELECT_RELEASE,
                    "serviceMonitorNamespaceSelector": {},
                },
            }
            r = http.post("/apis/monitoring.coreos.com/v1/namespaces/default/prometheuses", json=prom)
            assert r.status_code == 201, r.text
        controlplane.wait_nodes_ready(handle.kubeconfig, [*POOL, SYSTEM], timeout=60)
        yield handle
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture(scope="module")
def http(cp: controlplane.KubeHandle) -> Iterator[Any]:
    with controlplane.http_client(cp.kubeconfig, pool=2) as client:
        yield client


def _storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "fast", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "example.com/none",
    }


def _create_crd(http: Any, plural: str) -> None:
    r = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=_crd(plural))
    assert r.status_code == 201, r.text

    def established() -> bool:
        got = http.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{plural}.monitoring.coreos.com"
        )
        conds = got.json().get("status", {}).get("conditions") or [] if got.status_code == 200 else []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    wait_for(established, 30, f"CRD {plural} established")


def _patch(http: Any, path: str, body: dict[str, Any]) -> None:
    r = http.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text


def stack(cp: controlplane.KubeHandle, **over: Any) -> StackSpec:
    pool = {
        "name": "h100",
        "size": 2,
        "spares": 1,
        "gpusPerNode": 8,
        "labels": PRODUCT,
        "taints": [GPU_TAINT],
        **over.pop("pool", {}),
    }
    raw = {"cluster": {"backend": "kubeconfig", "kubeconfig": str(cp.kubeconfig)}, "pools": [pool], **over}
    return parse_stack_config(raw)


def check(report: Report, name: str) -> dict[str, str]:
    rows = {c.name: c for c in report.checks}
    assert name in rows, f"no check {name!r}: {list(rows)}"
    c = rows[name]
    return {"status": c.status, "detail": c.detail, "fix": c.fix}


def test_a_cluster_with_every_prerequisite_passes(cp) -> None:
    report = preflight(stack(cp), ROOT)
    assert report.ok, report.text()
    assert check(report, "pool h100: GPUs")["status"] == "pass"
    assert check(report, "storage: default class")["detail"].startswith("fast")
    assert check(report, "system node: runner")["detail"].startswith("1 Ready nodes")
    assert check(report, "kubelet versions") == {"status": "pass", "detail": f"{KUBELET} x4", "fix": ""}
    assert "not observable from the Kubernetes API" in check(report, "node OS, cgroups")["detail"]
    assert report.seconds < 5, report.seconds


def test_no_device_plugin_is_named_with_its_fix(cp, http) -> None:
    for name in POOL:
        _patch(http, f"/api/v1/nodes/{name}/status", {"status": {"allocatable": {"nvidia.com/gpu": None}}})
    try:
        report = preflight(stack(cp), ROOT)
    finally:
        for name in POOL:
            _patch(http, f"/api/v1/nodes/{name}/status", {"status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    assert check(report, "pool h100: GPUs") == {
        "status": "fail",
        "detail": "no node of pool h100 advertises nvidia.com/gpu",
        "fix": "install the NVIDIA device plugin or GPU Operator (it advertises the GPUs to Kubernetes)",
    }
    assert not report.ok


def test_fewer_gpus_than_the_pool_says_and_too_few_nodes(cp) -> None:
    report = preflight(stack(cp, pool={"gpusPerNode": 16, "size": 5}), ROOT)
    gpus = check(report, "pool h100: GPUs")
    assert gpus["status"] == "fail" and "advertise fewer than gpusPerNode 16" in gpus["detail"]
    nodes = check(report, "pool h100: nodes")
    assert nodes["status"] == "fail" and "3 Ready nodes labelled autoheal.io/pool=h100" in nodes["detail"]
    assert nodes["fix"].startswith("add 3 nodes (kubectl label node <node> autoheal.io/pool=h100)")


def test_a_pool_without_nodes_or_labels(cp) -> None:
    report = preflight(stack(cp, pool={"name": "a100", "labels": {"zone": "b"}}), ROOT)
    assert check(report, "pool a100: nodes") == {
        "status": "fail",
        "detail": "no node is labelled autoheal.io/pool=a100 (the pool wants size 2 + spares 1 = 3)",
        "fix": "label the pool's GPU nodes: kubectl label node <node> autoheal.io/pool=a100",
    }
    labels = check(preflight(stack(cp, pool={"labels": {"zone": "b"}}), ROOT), "pool h100: labels, taints")
    assert labels["status"] == "fail" and "zone=b missing on gpu-1, gpu-2, gpu-3" in labels["detail"]
    assert labels["fix"] == "kubectl label node <node> zone=b"
    # a taint the pool does not declare keeps its slurmd pods off
    untolerated = check(preflight(stack(cp, pool={"taints": []}), ROOT), "pool h100: labels, taints")
    assert (
        "tainted nvidia.com/gpu=present:NoSchedule, which slurmd does not tolerate" in untolerated["detail"]
    )


def test_storage_classes_named_and_default(cp, http) -> None:
    named = {"slurm": {"storage": {"stateStorageClass": "ebs-gp3"}}}
    c = check(preflight(stack(cp, **named), ROOT), "storage: ebs-gp3")
    assert c["status"] == "fail"
    assert c["detail"] == (
        "StorageClass ebs-gp3 (named by slurm.storage.stateStorageClass) does not exist; StorageClasses here: fast"
    )
    assert c["fix"].startswith("create StorageClass ebs-gp3")
    assert http.delete("/apis/storage.k8s.io/v1/storageclasses/fast").status_code == 200
    try:
        report = preflight(stack(cp), ROOT)
    finally:
        assert http.post("/apis/storage.k8s.io/v1/storageclasses", json=_storage_class()).status_code == 201
    c = check(report, "storage: default class")
    assert c["status"] == "fail" and c["detail"].startswith("no default StorageClass")
    assert "storageclass.kubernetes.io/is-default-class=true" in c["fix"]


def test_no_node_for_the_system_pods(cp, http) -> None:
    taint = {"spec": {"taints": [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]}}
    _patch(http, f"/api/v1/nodes/{SYSTEM}", taint)
    try:
        report = preflight(stack(cp), ROOT)
        tolerant = preflight(
            stack(cp, slurm={"tolerateTaints": [GPU_TAINT]}, runner={"tolerateTaints": [GPU_TAINT]}), ROOT
        )
    finally:
        _patch(http, f"/api/v1/nodes/{SYSTEM}", {"spec": {"taints": None}})
    c = check(report, "system node: runner")
    assert c["status"] == "fail"
    assert (
        "sys-1: maintenance=true:NoSchedule" in c["detail"]
        and "gpu-1: nvidia.com/gpu=present:NoSchedule" in c["detail"]
    )
    assert c["fix"].startswith(
        "add an untainted system node (a CPU node group), or set runner.tolerateTaints"
    )
    # system pods that tolerate the GPU taint may share the GPU nodes
    assert check(tolerant, "system node: slurmctld, login")["status"] == "pass"
    # a nodeSelector no node matches
    sel = check(preflight(stack(cp, runner={"nodeSelector": {"pool": "cpu"}}), ROOT), "system node: runner")
    assert sel["detail"] == "no node matching runner.nodeSelector {'pool': 'cpu'}"


def test_an_old_kubelet_fails(cp, http) -> None:
    _patch(http, "/api/v1/nodes/gpu-2/status", {"status": {"nodeInfo": {"kubeletVersion": "v1.27.9"}}})
    try:
        c = check(preflight(stack(cp), ROOT), "kubelet versions")
    finally:
        _patch(http, "/api/v1/nodes/gpu-2/status", {"status": {"nodeInfo": {"kubeletVersion": KUBELET}}})
    assert c == {
        "status": "fail",
        "detail": "kubelets older than 1.29: gpu-2 (v1.27.9)",
        "fix": "upgrade those nodes' kubelets to 1.29 or later (or drain and replace them)",
    }


def test_prometheus_operator_crds_and_selectors(cp, http) -> None:
    operator = {"monitoring": {"prometheusOperator": True}}
    report = preflight(stack(cp, **operator), ROOT)
    assert check(report, "prometheus operator: CRDs")["status"] == "pass"
    selectors = check(report, "prometheus operator: selectors")
    # the objects carry no `release` label: the Prometheus selects neither
    assert selectors["status"] == "fail", selectors
    assert "PrometheusRule (namespace autoheal) is selected by none" in selectors["detail"]
    assert selectors["fix"].startswith("set monitoring.operatorLabels")
    labelled = {"monitoring": {"prometheusOperator": True, "operatorLabels": {"release": "kps"}}}
    ok = check(preflight(stack(cp, **labelled), ROOT), "prometheus operator: selectors")
    assert ok["status"] == "pass", ok
    assert ok["detail"] == (
        "PrometheusRule by default/k8s; ServiceMonitor by default/k8s; "
        "AlertmanagerConfig: no Alertmanager object to select it (not checked)"
    ), ok
    name = "servicemonitors.monitoring.coreos.com"
    assert http.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").status_code == 200
    wait_for(
        lambda: (
            http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").status_code == 404
        ),
        30,
        "CRD deleted",
    )
    try:
        c = check(preflight(stack(cp, **operator), ROOT), "prometheus operator: CRDs")
    finally:
        _create_crd(http, "servicemonitors")
    assert c["status"] == "fail"
    assert c["detail"] == (
        "monitoring.prometheusOperator is true, but servicemonitors.monitoring.coreos.com not installed"
    )
    assert c["fix"].startswith("install the Prometheus Operator")
    # without the operator, no CRD is asked for
    assert not [c for c in preflight(stack(cp), ROOT).checks if c.name.startswith("prometheus")]


def test_the_cli_prints_a_table_or_json_and_exits_by_the_verdict(cp, tmp_path) -> None:
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    doc = {
        "config": {
            "autoheal:cluster": {"backend": "kubeconfig", "kubeconfig": str(cp.kubeconfig)},
            "autoheal:pools": [
                {"name": "h100", "size": 2, "spares": 1, "labels": PRODUCT, "taints": [GPU_TAINT]}
            ],
        }
    }
    (tmp_path / "Pulumi.ok.yaml").write_text(yaml.safe_dump(doc))
    doc["config"]["autoheal:slurm"] = {"storage": {"sharedStorageClass": "efs"}}
    (tmp_path / "Pulumi.bad.yaml").write_text(yaml.safe_dump(doc))
    ok = subprocess.run(
        [AUTOHEAL, "preflight", "--stack", "ok", "--project", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "pool h100: GPUs" in ok.stdout and "preflight ok" in ok.stderr
    bad = subprocess.run(
        [AUTOHEAL, "preflight", "--stack", "bad", "--project", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1, bad.stdout + bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["stack"] == "bad"
    failed = [c["name"] for c in doc["checks"] if c["status"] == "fail"]
    assert failed == ["storage: efs"]


def test_the_pulumi_program_fails_the_preview_with_the_report(cp, tmp_path) -> None:
    """`__main__.py` runs the preflight before declaring anything (here under Pulumi's mocks,
    which run the program as the engine does, without the engine)."""
    from review.mockstack import run_project

    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    config = {
        "autoheal:cluster": {"backend": "kubeconfig", "kubeconfig": str(cp.kubeconfig)},
        "autoheal:pools": [{"name": "h100", "size": 2, "spares": 1, "gpusPerNode": 8}],
        "autoheal:slurm": {"storage": {"stateStorageClass": "missing-class"}},
        "autoheal:runner": {
            "rulesFile": str(ROOT / "config/rules.yaml"),
            "playbooksDir": str(ROOT / "playbooks"),
        },
    }
    (tmp_path / "Pulumi.pf.yaml").write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(Exception, match="StorageClass missing-class") as err:
        run_project(tmp_path, "pf")
    assert "not ready for this stack" in str(err.value)
    assert "fix: create StorageClass missing-class" in str(err.value)


def test_an_unreachable_cluster_fails_in_seconds(tmp_path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    cfg = parse_stack_config(
        {
            "cluster": {"backend": "kubeconfig", "kubeconfig": str(kubeconfig)},
            "pools": [{"name": "h100", "size": 1}],
        }
    )
    t0 = time.monotonic()
    report = preflight(cfg, ROOT)
    took = time.monotonic() - t0
    assert took < 3, took
    [c] = report.checks
    assert c.name == "cluster reachable" and c.status == "fail"
    assert f"https://127.0.0.1:{port}: connection refused" in c.detail
    assert c.fix.startswith("start the cluster or fix cluster.kubeconfig")
    missing = preflight(cfg, ROOT, kubeconfig=str(tmp_path / "nope"))
    assert missing.checks[0].detail == f"kubeconfig {tmp_path / 'nope'} does not exist"


def _token_kubeconfig(cp: controlplane.KubeHandle, path: Path, token: str) -> Path:
    """A kubeconfig for the same API server with a bearer token instead of the admin's certificate."""
    admin = yaml.safe_load(cp.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_user_who_may_not_read_the_cluster(cp, http, tmp_path) -> None:
    """A ServiceAccount without RBAC: its reads are refused and the checks say so; a token the API
    server does not know is refused at once."""
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "preflight-nobody"}}
    assert http.post("/api/v1/namespaces/default/serviceaccounts", json=sa).status_code in (201, 409)
    r = http.post(
        "/api/v1/namespaces/default/serviceaccounts/preflight-nobody/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert r.status_code == 201, r.text
    nobody = _token_kubeconfig(cp, tmp_path / "nobody", r.json()["status"]["token"])
    report = preflight(stack(cp), ROOT, kubeconfig=str(nobody))
    rows = {c.name: c for c in report.checks}
    assert rows["cluster reachable"].status == "pass"  # /version is open to every user
    assert rows["read access"].status == "fail" and "may not list nodes (403" in rows["read access"].detail
    assert (
        rows["storage classes"].detail
        == "cannot list StorageClasses (403 reading /apis/storage.k8s.io/v1/storageclasses)"
    )
    assert not [name for name in rows if name.startswith(("pool", "system node", "kubelet"))]
    bad = preflight(stack(cp), ROOT, kubeconfig=str(_token_kubeconfig(cp, tmp_path / "bad", "not-a-token")))
    [c] = bad.checks
    assert (
        c.status == "fail"
        and "GET /version answered 401: the kubeconfig's credentials were refused" in c.detail
    )
