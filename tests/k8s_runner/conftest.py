"""Fixtures for the runner-in-the-cluster tests: a lab with real Slurm and a real Kubernetes
control plane (KWOK nodes), the runner's RBAC exactly as its Pulumi component declares it, and
a kubeconfig that authenticates as the runner's ServiceAccount (a token minted by TokenRequest,
written the way the runner writes its in-cluster kubeconfig: remediation.incluster)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.runbook.conftest import AUTOHEAL, REPO, Lab
from tests.support import port_base

LAB_NAME = "b-k8s-runner"
PORT_BASE = port_base(29000)
RUNNER_NS = "autoheal"
RUNNER_SA = "autoheal-runner"


def _lab_cmd(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AUTOHEAL, "lab", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="package")
def kube_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Slurm + the Kubernetes control plane + the pool controller; no runner of the lab's own
    (the tests run the plays and the sync themselves) and no watchers (CPU)."""
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    if not (Path.home() / ".cache/autoheal/bin/kube-apiserver").exists():
        pytest.skip("the Kubernetes control plane is not built (scripts/build-tools.sh)")
    root = tmp_path_factory.mktemp("k8srunner")
    lab = Lab(
        name=LAB_NAME,
        root=root,
        slurm_conf=root / LAB_NAME / "slurm" / "slurm.conf",
        kubeconfig=root / LAB_NAME / "kubeconfig",
        run_dir=root / LAB_NAME,
        journal=tmp_path_factory.mktemp("k8srunner-journal") / "events.jsonl",
    )
    args = ["--name", LAB_NAME, "--root", str(root)]
    up = [*args, "--port-base", str(PORT_BASE), "--grace", "20", "--provision-delay", "3"]
    try:
        res = _lab_cmd("up", *up, "--no-runner", "--no-watchers")
        if res.returncode != 0:
            raise AssertionError(f"autoheal lab up failed: {res.stdout}\n{res.stderr}")
        yield lab
    finally:
        _lab_cmd("down", *args, timeout=180)


def runner_rbac_objects() -> list[dict[str, Any]]:
    """The ServiceAccount, roles and bindings RemediationRunner declares, as the Kubernetes
    provider would send them (built under Pulumi mocks: the component's own output, not a copy)."""
    from components.runner import RemediationRunner, RemediationRunnerArgs
    from review.mockstack import run_program

    def program() -> dict[str, Any]:
        RemediationRunner("runner", RemediationRunnerArgs(namespace=RUNNER_NS))
        return {}

    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    objects = [dict(r.inputs) for r in run_program(program).resources if r.inputs.get("kind") in kinds]
    assert {o["kind"] for o in objects} == kinds, objects
    return objects


@dataclass(frozen=True)
class Identity:
    """The runner's ServiceAccount on the lab: its kubeconfig and an HTTP client with its token."""

    kubeconfig: Path
    token: str
    api_url: str
    ca_file: Path
    objects: list[dict[str, Any]]

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.api_url,
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            timeout=15.0,
        )


def mint_token(lab: Lab, namespace: str, account: str, seconds: int = 3600) -> str:
    """A token for the account through the TokenRequest API (as the kubelet gets a pod's)."""
    from lab import controlplane

    assert lab.kubeconfig is not None
    with controlplane.http_client(lab.kubeconfig) as http:
        r = http.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            json={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        assert r.status_code == 201, r.text
        token: str = r.json()["status"]["token"]
        return token


@pytest.fixture(scope="package")
def runner_identity(kube_lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Identity:
    """Apply the component's RBAC with the admin kubeconfig, then become the runner."""
    from remediation.incluster import InCluster, write_kubeconfig

    objects = runner_rbac_objects()
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RUNNER_NS}}
    kube_lab.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [namespace]})
    )
    kube_lab.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )
    token = mint_token(kube_lab, RUNNER_NS, RUNNER_SA)
    sa_dir = tmp_path_factory.mktemp("sa")
    (sa_dir / "token").write_text(token)
    ca = kube_lab.run_dir / "pki" / "ca.crt"
    api_url = json.loads((kube_lab.run_dir / "cluster.json").read_text())["api_url"]
    kubeconfig = write_kubeconfig(
        InCluster(api_url, sa_dir / "token", ca, RUNNER_NS), sa_dir / "runner.kubeconfig"
    )
    return Identity(kubeconfig, token, api_url, ca, objects)
