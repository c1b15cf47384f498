"""The Pulumi engine, built from source, runs a Python stack offline against the lab cluster.

A tiny stack (one Namespace, one ConfigMap, explicit Kubernetes provider using the lab's
kubeconfig) goes through `pulumi up`, a second `up` that must change nothing, and `destroy`,
with local file state and no plugin download.
"""

from __future__ import annotations

import subprocess
import textwrap
from typing import Any

import pytest

from lab import controlplane
from lab.pulumi_env import pulumi_bin, pulumi_env
from tests.support import port_base

pytestmark = [pytest.mark.kube, pytest.mark.pulumi]

PORT_BASE = port_base(27300)
NAMESPACE = "autoheal-pulumi-itest"

PROGRAM = textwrap.dedent(
    """
    import os

    import pulumi
    import pulumi_kubernetes as k8s

    provider = k8s.Provider("lab", kubeconfig=os.environ["LAB_KUBECONFIG"])
    opts = pulumi.ResourceOptions(provider=provider)
    ns = k8s.core.v1.Namespace("ns", metadata={"name": "NAMESPACE"}, opts=opts)
    cm = k8s.core.v1.ConfigMap(
        "settings",
        metadata={"name": "settings", "namespace": ns.metadata["name"]},
        data={"grace_seconds": "30"},
        opts=opts,
    )
    pulumi.export("configmap", cm.metadata["name"])
    """
).replace("NAMESPACE", NAMESPACE)


@pytest.fixture(scope="module")
def cp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("kube-pulumi")
    try:
        yield controlplane.start_control_plane(run_dir, [], PORT_BASE, timeout=180)
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture(scope="module")
def core(cp):
    from kubernetes.client import CoreV1Api

    client = controlplane.api_client(cp.kubeconfig)
    yield CoreV1Api(client)
    client.close()


@pytest.fixture(scope="module")
def stack(cp, tmp_path_factory):
    project = tmp_path_factory.mktemp("stack")
    (project / "Pulumi.yaml").write_text("name: autoheal-itest\nruntime: python\n")
    (project / "__main__.py").write_text(PROGRAM)
    env = pulumi_env(tmp_path_factory.mktemp("pulumi-state"))
    env["LAB_KUBECONFIG"] = str(cp.kubeconfig)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(pulumi_bin()), *args, "--non-interactive"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return res

    run("stack", "init", "itest")
    return run


def namespace_exists(core: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        ns = core.read_namespace(NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return bool(ns.status.phase == "Active")


def test_up_creates_the_objects_in_the_cluster(stack, core):
    stack("up", "--yes", "--skip-preview")
    assert namespace_exists(core)
    cm = core.read_namespaced_config_map("settings", NAMESPACE)
    assert cm.data == {"grace_seconds": "30"}
    assert stack("stack", "output", "configmap").stdout.strip() == "settings"


def test_a_second_up_changes_nothing(stack):
    res = stack("up", "--yes", "--expect-no-changes")
    assert "unchanged" in res.stdout


def test_destroy_removes_the_objects(stack, core):
    import time

    from kubernetes.client.exceptions import ApiException

    stack("destroy", "--yes", "--skip-preview")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("settings", NAMESPACE)
    assert err.value.status == 404
    # A namespace goes through Terminating; the namespace controller finishes it.
    deadline = time.monotonic() + 60
    while namespace_exists(core) or _terminating(core):
        assert time.monotonic() < deadline, "namespace still present after destroy"
        time.sleep(0.5)


def _terminating(core: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        return bool(core.read_namespace(NAMESPACE).status.phase == "Terminating")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
