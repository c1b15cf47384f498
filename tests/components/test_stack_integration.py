"""The lab stack under the real Pulumi engine, offline, against a real Kubernetes control plane.

`pulumi up` of the stack (a copy of the project's Pulumi.yaml and __main__.py with the lab's
config pointed at this test's control plane), then: the objects are in the cluster as declared;
a second `up` and a `preview` change nothing, also after the runtime replaced a pool node; adding
a pool adds exactly that pool's resources (plus the regenerated Slurm config); `destroy` removes
everything; the policy rules accept the previewed resources. The state, kept in a temporary file
backend, holds the generated secrets only encrypted. Needs the Go-built tools (scripts/build-tools.sh); a missing tool fails, never skips.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab import controlplane
from lab.pulumi_env import pulumi_bin, pulumi_env
from tests.components.harness import ROOT
from tests.support import port_base

pytestmark = [pytest.mark.kube, pytest.mark.pulumi]

PORT_BASE = port_base(27400)
STACK = "itest"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
SPARE_TAINT = {"key": "autoheal.io/spare", "value": "true", "effect": "NoSchedule"}

Run = Callable[..., subprocess.CompletedProcess[str]]


def _node(name: str, pool: str = "h100", spare: bool = False) -> controlplane.KubeNodeSpec:
    labels = {"autoheal.io/pool": pool, "autoheal.io/gpu-model": pool}
    if spare:
        labels["autoheal.io/spare"] = "true"
    taints = [dict(GPU_TAINT), dict(SPARE_TAINT)] if spare else [dict(GPU_TAINT)]
    return controlplane.KubeNodeSpec(name=name, labels=labels, taints=taints)


@pytest.fixture(scope="module")
def cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.KubeHandle]:
    run_dir = tmp_path_factory.mktemp("kube-stack")
    nodes = [_node(f"gpu-{i}") for i in range(1, 5)] + [_node(f"gpu-{i}", spare=True) for i in (5, 6)]
    try:
        yield controlplane.start_control_plane(run_dir, nodes, PORT_BASE, timeout=240)
    finally:
        controlplane.stop_control_plane(run_dir)


@pytest.fixture(scope="module")
def api(cp: controlplane.KubeHandle) -> Iterator[Any]:
    client = controlplane.api_client(cp.kubeconfig)
    yield client
    client.close()


def _stack_config(kubeconfig: Path, extra_pools: list[dict[str, Any]] | None = None) -> str:
    doc = yaml.safe_load((ROOT / "Pulumi.lab.yaml").read_text())
    cfg = copy.deepcopy(doc["config"])
    cfg["autoheal:cluster"]["kubeconfig"] = str(kubeconfig)
    cfg["autoheal:runner"] = {
        **cfg.get("autoheal:runner", {}),
        "rulesFile": str(ROOT / "config" / "rules.yaml"),
        "playbooksDir": str(ROOT / "playbooks"),
    }
    cfg["autoheal:pools"] = cfg["autoheal:pools"] + (extra_pools or [])
    return yaml.safe_dump({"config": cfg}, sort_keys=False)


@pytest.fixture(scope="module")
def project(cp: controlplane.KubeHandle, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project (Pulumi.yaml, __main__.py) outside the work tree, so the test's stack
    file and state never touch the repository; the virtualenv is the project's."""
    proj = tmp_path_factory.mktemp("project")
    for name in ("Pulumi.yaml", "__main__.py"):
        (proj / name).write_text((ROOT / name).read_text())
    (proj / ".venv").symlink_to(ROOT / ".venv")
    (proj / f"Pulumi.{STACK}.yaml").write_text(_stack_config(cp.kubeconfig))
    return proj


@pytest.fixture(scope="module")
def pulumi(project: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    env = pulumi_env(tmp_path_factory.mktemp("pulumi-state"))

    def run(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(
            [str(pulumi_bin()), *args, "--non-interactive"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
        return res

    stack_file = project / f"Pulumi.{STACK}.yaml"
    config = stack_file.read_text()
    run("stack", "init", STACK)
    # `stack init` writes the passphrase salt into the stack file; keep it, with our config.
    salt = {k: v for k, v in (yaml.safe_load(stack_file.read_text()) or {}).items() if k != "config"}
    stack_file.write_text(yaml.safe_dump({**salt, **yaml.safe_load(config)}, sort_keys=False))
    return run


def _preview_changes(pulumi: Run, *extra: str) -> list[tuple[str, str, str]]:
    res = pulumi("preview", "--json", *extra)
    doc = json.loads(res.stdout)
    out = []
    for step in doc.get("steps", []):
        if step["op"] == "same":
            continue
        urn = step["urn"]
        rtype = urn.split("::")[2].split("$")[-1]
        out.append((step["op"], rtype, urn.split("::")[-1]))
    return sorted(out)


def _core(api: Any) -> Any:
    from kubernetes.client import CoreV1Api

    return CoreV1Api(api)


def test_up_creates_the_stack_in_the_cluster(pulumi: Run, api: Any) -> None:
    from kubernetes.client import AppsV1Api, RbacAuthorizationV1Api

    pulumi("up", "--yes", "--skip-preview")
    core: Any = _core(api)
    apps: Any = AppsV1Api(api)
    assert {ns.metadata.name for ns in core.list_namespace().items} >= {"autoheal", "slurm"}
    pool = json.loads(core.read_namespaced_config_map("autoheal-pool-h100", "autoheal").data["pool.json"])
    assert (pool["size"], pool["spares"]) == (4, 2)
    conf = core.read_namespaced_config_map("slurm-config", "slurm").data["slurm.conf"]
    # dynamic nodes: room for size + spares + headroom, the pool found by its feature
    assert "MaxNodeCount=12" in conf and "NodeSet=ns_h100 Feature=pool_h100" in conf
    role: Any = RbacAuthorizationV1Api(api).read_cluster_role("autoheal-runner")
    assert sorted((r.resources[0], tuple(r.verbs)) for r in role.rules) == [
        ("controllerrevisions", ("list",)),  # the slurmd rollout's stale pods
        ("nodes", ("get", "list", "watch", "patch")),
        ("pods", ("get", "list")),
        ("pods/eviction", ("create",)),
    ]
    sts = apps.read_namespaced_stateful_set("slurmctld", "slurm")
    assert [t.metadata.name for t in sts.spec.volume_claim_templates] == ["state"]
    ds = apps.read_namespaced_daemon_set("slurmd-h100", "slurm")
    assert ds.spec.template.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}


def test_generated_secrets_are_random_and_only_encrypted_in_state(pulumi: Run, api: Any) -> None:
    core = _core(api)
    token = base64.b64decode(core.read_namespaced_secret("autoheal-runner-token", "autoheal").data["token"])
    munge = base64.b64decode(core.read_namespaced_secret("munge-key", "slurm").data["munge.key"])
    host_key = base64.b64decode(
        core.read_namespaced_secret("slurm-login-hostkey", "slurm").data["ssh_host_ed25519_key"]
    ).decode()
    assert len(token) >= 43 and len(munge) == 1024
    assert host_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    state = pulumi("stack", "export").stdout
    assert token.decode() not in state
    assert base64.b64encode(munge).decode() not in state
    assert host_key.splitlines()[1] not in state
    assert pulumi("stack", "output", "loginHostKey").stdout.startswith("ssh-ed25519 ")


def test_a_second_up_and_a_preview_change_nothing(pulumi: Run) -> None:
    pulumi("up", "--yes", "--expect-no-changes")
    assert _preview_changes(pulumi) == []


def test_policy_rules_accept_the_previewed_stack(pulumi: Run) -> None:
    """The pack's rules over the engine's own view of every resource. (`--policy-pack` itself
    needs RunPlugin, which the offline-built language host does not implement.)"""
    from policy import preview_check

    preview = json.loads(pulumi("preview", "--json", "--show-sames").stdout)
    resources = preview_check.resources_of(preview)
    assert len(resources) >= 30
    assert preview_check.violations(resources) == []


def test_replacing_a_node_at_runtime_leaves_nothing_to_change(
    cp: controlplane.KubeHandle, pulumi: Run
) -> None:
    controlplane.delete_node(cp, "gpu-3")  # the runbook retired it
    controlplane.add_nodes(cp, [_node("gpu-7", spare=True)], timeout=60)  # the pool controller backfilled
    pulumi("preview", "--expect-no-changes")


def test_adding_a_pool_adds_exactly_that_pools_resources(
    project: Path, cp: controlplane.KubeHandle, pulumi: Run
) -> None:
    stack_file = project / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    new_pool = {"name": "a100", "prefix": "a", "gpuModel": "a100", "size": 1, "spares": 1}
    doc["config"]["autoheal:pools"].append(new_pool)
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    changes = _preview_changes(pulumi)
    creates = {(t, n) for op, t, n in changes if op == "create"}
    others = {(op, t, n) for op, t, n in changes if op != "create"}
    assert creates == {
        ("autoheal:nodepool:GpuNodePool", "pool-a100"),
        ("kubernetes:core/v1:ConfigMap", "pool-a100-pool"),
        ("autoheal:slurm:SlurmWorkers", "slurm-workers-a100"),
        ("kubernetes:apps/v1:DaemonSet", "slurm-slurmd-a100"),
    }
    # The generated Slurm config gains the pool's NodeSet; the controller and login roll with it,
    # and the runner's copy of it (its Slurm client reads the file at each call) follows. The
    # runner's config names the new pool's backend (pool_backends): it rolls with its config.
    assert others <= {
        ("update", "kubernetes:core/v1:ConfigMap", "slurm-config"),
        ("update", "kubernetes:core/v1:ConfigMap", "runner-slurm"),
        ("update", "kubernetes:apps/v1:StatefulSet", "slurm-slurmctld"),
        ("update", "kubernetes:apps/v1:Deployment", "slurm-login"),
        # the other pools' slurmd templates carry the new slurm.conf's hash (OnDelete: no pod
        # restarts until playbooks/slurm_rollout.yml)
        ("update", "kubernetes:apps/v1:DaemonSet", "slurm-slurmd-h100"),
        ("update", "kubernetes:core/v1:ConfigMap", "runner-config"),
        ("update", "kubernetes:apps/v1:Deployment", "runner-deployment"),
    }
    assert ("update", "kubernetes:core/v1:ConfigMap", "slurm-config") in others
    pulumi("up", "--yes", "--skip-preview")
    conf = _core(controlplane.api_client(cp.kubeconfig)).read_namespaced_config_map("slurm-config", "slurm")
    assert "PartitionName=a100 Nodes=ns_a100 " in conf.data["slurm.conf"]


def test_destroy_removes_everything(pulumi: Run, api: Any) -> None:
    from kubernetes.client import RbacAuthorizationV1Api
    from kubernetes.client.exceptions import ApiException

    pulumi("destroy", "--yes", "--skip-preview")
    core = _core(api)
    with pytest.raises(ApiException) as err:
        RbacAuthorizationV1Api(api).read_cluster_role("autoheal-runner")
    assert err.value.status == 404
    deadline = time.monotonic() + 120
    while {ns.metadata.name for ns in core.list_namespace().items} & {"autoheal", "slurm"}:
        assert time.monotonic() < deadline, "namespaces still present after destroy"
        time.sleep(1)
    # Only the stack itself is left in the state.
    assert pulumi("stack", "export").stdout.count('"urn"') <= 1
