"""The karpenter pool backend against the real Karpenter controller (its KWOK cloud provider).

One lab control plane for the module, with Karpenter v1.14.1 running as a lab process
(lab/karpenter.py): a pool of 3 nodes and 1 spare comes up as two static NodePools; retiring a
node deletes its NodeClaim, Karpenter launches the replacement and the new Node is Ready with the
pool's labels and taints; a second retire changes nothing; reboot answers "not supported".
Skipped, saying so, only when `karpenter-kwok` is not built (scripts/build-tools.sh builds it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoheal import labels as lb
from lab import controlplane, karpenter
from lab.config import PoolConfig
from lab.pool import node_labels
from pools.base import BackendError
from pools.cli import wait_replacements
from pools.karpenter import NODEPOOL_LABEL, KarpenterBackend
from tests.support import port_base, processes_pointing_into, wait_for

pytestmark = pytest.mark.kube

PORT_BASE = port_base(29600)
POOL = PoolConfig(name="kp", size=3, spares=1, gpus_per_node=8)
UP_TIMEOUT = 120.0
AUTOHEAL = Path(sys.executable).parent / "autoheal"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.KubeHandle]:
    try:
        controlplane.tool_path(karpenter.BINARY)
    except controlplane.ToolMissingError as exc:
        pytest.skip(f"KARPENTER NOT TESTED: {exc}")
    run_dir = tmp_path_factory.mktemp("karpenter")
    try:
        handle = controlplane.start_control_plane(run_dir, [], PORT_BASE, timeout=180)
        karpenter.start(run_dir, handle.kubeconfig, [POOL], PORT_BASE)
        yield handle
    finally:
        karpenter.stop(run_dir)
        controlplane.stop_control_plane(run_dir)
    assert not processes_pointing_into(run_dir), "a lab process outlived the module"
    shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def backend(lab: controlplane.KubeHandle) -> KarpenterBackend:
    return KarpenterBackend(str(lab.kubeconfig))


def _nodes(lab: controlplane.KubeHandle) -> dict[str, dict[str, Any]]:
    with controlplane.http_client(lab.kubeconfig, pool=1) as http:
        r = http.get("/api/v1/nodes")
        r.raise_for_status()
        return {n["metadata"]["name"]: n for n in r.json()["items"]}


def _ready(node: dict[str, Any]) -> bool:
    conds = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _pool_up(lab: controlplane.KubeHandle) -> dict[str, list[str]]:
    """NodePool -> its Ready nodes, once both are at their replicas (else {})."""
    got = {
        np: sorted(n for n, ok in karpenter.pool_nodes(lab.kubeconfig, np).items() if ok)
        for np in ("kp", "kp-spare")
    }
    return got if len(got["kp"]) == POOL.size and len(got["kp-spare"]) == POOL.spares else {}


def _taints(node: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["key"], t["effect"]) for t in node["spec"].get("taints") or []}


def test_pool_comes_up_with_its_labels_taints_and_gpus(lab: controlplane.KubeHandle) -> None:
    up = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "Karpenter to launch 3 active + 1 spare Ready nodes")
    nodes = _nodes(lab)
    for np, spare in (("kp", False), ("kp-spare", True)):
        for name in up[np]:
            node = nodes[name]
            assert node["metadata"]["labels"].items() >= node_labels(POOL, spare).items(), name
            assert node["spec"]["providerID"] == f"kwok://{name}"
            assert node["status"]["allocatable"][lb.GPU_RESOURCE] == "8"
            want = {(lb.GPU_RESOURCE, "NoSchedule")} | (
                {(lb.SPARE_TAINT_KEY, "NoSchedule")} if spare else set()
            )
            # Karpenter's own registration taint is gone: the node registered with its NodeClaim
            assert _taints(node) == want, name


def test_health_counts_nodepools_and_nodeclaims(
    lab: controlplane.KubeHandle, backend: KarpenterBackend
) -> None:
    wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")
    (health,) = backend.health(["kp"])
    assert health.ok, health.detail
    assert health.counts["nodepools"] == 2
    assert health.counts["desired"] == health.counts["ready_nodes"] == POOL.size + POOL.spares
    (missing,) = backend.health(["nope"])
    assert not missing.ok and "no NodePool" in missing.detail


def test_retire_deletes_the_nodeclaim_and_karpenter_replaces_the_node(
    lab: controlplane.KubeHandle, backend: KarpenterBackend
) -> None:
    victim = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"][0]
    claim = next(c for c in backend.claims() if c.node == victim)
    (dry,) = backend.retire([victim], dry_run=True)
    assert dry.ok and not dry.changed and dry.extra["would_retire"], dry.detail
    assert claim.name in {c.name for c in backend.claims() if not c.deleting}
    # what `autoheal pool retire --wait-replacement` does: retire, then wait on the pool's health
    before = backend.health([])
    results = wait_replacements(backend, backend.retire([victim]), before, UP_TIMEOUT, poll=0.5)
    (res,) = results
    assert res.ok and res.changed, res.detail
    assert res.instance == claim.name and res.extra["pool"] == "kp"
    (new,) = res.extra["replacements"]
    assert new != victim
    node = _nodes(lab)[new]
    assert _ready(node)
    assert node["metadata"]["labels"][NODEPOOL_LABEL] == "kp"
    assert node["metadata"]["labels"].items() >= node_labels(POOL, spare=False).items()
    # Karpenter finishes the termination: the old NodeClaim and its Node go away
    wait_for(lambda: all(c.name != claim.name for c in backend.claims()), 60, "the old NodeClaim to go")
    wait_for(lambda: victim not in _nodes(lab), 60, "the retired Node to go")
    # a second retire changes nothing
    (again,) = backend.retire([victim])
    assert again.ok and not again.changed, again.detail
    assert "already retired" in again.detail
    (health,) = backend.health(["kp"])
    assert health.ok and new in health.members and victim not in health.members


def test_the_autoheal_pool_cli_drives_the_backend(lab: controlplane.KubeHandle) -> None:
    """`autoheal pool ... --backend karpenter --json`, as the runbook's tasks call it."""
    victim = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"][0]

    def cli(*args: str) -> list[dict[str, Any]]:
        argv = [str(AUTOHEAL), "pool", *args, "--backend", "karpenter", "--kubeconfig", str(lab.kubeconfig)]
        res = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=UP_TIMEOUT + 60)
        assert res.returncode == 0, res.stderr
        out: list[dict[str, Any]] = json.loads(res.stdout)
        return out

    (status,) = cli("status", "--pool", "kp")
    assert status["ok"] and status["counts"]["desired"] == POOL.size + POOL.spares
    (reboot,) = cli("reboot", "--nodes", victim, "--timeout", "5")
    assert not reboot["ok"] and "no reboot" in reboot["detail"]
    (res,) = cli("retire", "--nodes", victim, "--wait-replacement", "--timeout", str(UP_TIMEOUT))
    assert res["ok"] and res["changed"] and len(res["extra"]["replacements"]) == 1, res
    (again,) = cli("retire", "--nodes", victim)
    assert again["ok"] and not again["changed"], again


PLAY = """
- hosts: localhost
  connection: local
  tasks:
    - ansible.builtin.include_role: {name: node_pool, tasks_from: "{{ op }}"}
    - ansible.builtin.copy:
        dest: "{{ facts_file }}"
        content: "{{ (FACTS) | to_json }}"
      changed_when: false
      check_mode: false
"""
RETIRE_FACTS = (
    "{'retired': node_pool_retired, 'skipped': node_pool_retire_skipped,"
    " 'replacements': node_pool_replacements, 'failed': node_pool_retire_failed}"
)
REBOOT_FACTS = "{'rebooted': node_pool_rebooted, 'failed': node_pool_reboot_failed}"


def _play(
    tmp_path: Path, op: str, facts: str, extra: dict[str, Any], *flags: str
) -> tuple[int, dict[str, Any]]:
    """Run roles/node_pool's `op` tasks once; (tasks changed, the facts they published)."""
    (tmp_path / "play.yml").write_text(PLAY.replace("FACTS", facts))
    out = tmp_path / "facts.json"
    (tmp_path / "vars.json").write_text(json.dumps({**extra, "op": op, "facts_file": str(out)}))
    argv = [
        str(AUTOHEAL.parent / "ansible-playbook"),
        str(tmp_path / "play.yml"),
        "-e",
        f"@{tmp_path / 'vars.json'}",
    ]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    res = subprocess.run([*argv, *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    m = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", res.stdout)
    assert m, res.stdout[-2000:]
    return int(m.group(1)), json.loads(out.read_text())


def test_the_runbook_retires_through_karpenter(lab: controlplane.KubeHandle, tmp_path: Path) -> None:
    """roles/node_pool's karpenter tasks: check mode changes nothing, the play retires and publishes
    the replacement, and a second run changes nothing."""
    victim = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"][0]
    extra = {
        "node_pool_backend": "karpenter",
        "node_pool_nodes": [victim],
        "node_pool_kubeconfig": str(lab.kubeconfig),
        "node_pool_wait_replacement": True,
        "node_pool_replacement_timeout": int(UP_TIMEOUT),
    }

    def play(*flags: str) -> tuple[int, dict[str, Any]]:
        return _play(tmp_path, "retire", RETIRE_FACTS, extra, *flags)

    changed, got = play("--check")
    assert changed == 0 and got["retired"] == [] and got["skipped"] == [victim], got
    assert victim in karpenter.pool_nodes(lab.kubeconfig, "kp")
    changed, got = play()
    assert changed == 1 and got["retired"] == [victim] and got["failed"] == {}, got
    (new,) = got["replacements"]
    assert _ready(_nodes(lab)[new])
    changed, got = play()
    assert changed == 0 and got["retired"] == [] and got["skipped"] == [victim] and got["failed"] == {}, got


def test_the_runbook_reboot_says_karpenter_cannot(lab: controlplane.KubeHandle, tmp_path: Path) -> None:
    nodes = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"][:2]
    extra = {
        "node_pool_backend": "karpenter",
        "node_pool_nodes": nodes,
        "node_pool_kubeconfig": str(lab.kubeconfig),
    }
    changed, got = _play(tmp_path, "reboot", REBOOT_FACTS, extra)
    assert changed == 0 and got["rebooted"] == [], got
    assert sorted(got["failed"]) == sorted(nodes) and all(
        "no reboot" in why for why in got["failed"].values()
    )


def test_retire_twice_in_one_batch_while_deleting(
    lab: controlplane.KubeHandle, backend: KarpenterBackend
) -> None:
    """A retry right after the first call (a crash after the delete): the NodeClaim is already
    deleting, so nothing is deleted again."""
    victim = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp-spare"][0]
    first, second = backend.retire([victim]), backend.retire([victim])
    assert first[0].ok and first[0].changed, first[0].detail
    assert second[0].ok and not second[0].changed, second[0].detail

    def replaced() -> dict[str, list[str]]:
        up = _pool_up(lab)
        return up if up and victim not in up["kp-spare"] else {}

    up = wait_for(replaced, UP_TIMEOUT, "the spare NodePool's replacement")
    assert _nodes(lab)[up["kp-spare"][0]]["metadata"]["labels"][lb.SPARE_LABEL] == "true"


def test_a_node_deleted_outside_the_backend_is_replaced_and_retires_once(
    lab: controlplane.KubeHandle, backend: KarpenterBackend
) -> None:
    """Someone (the dead-node cleanup, a human) deletes the Node: Karpenter's termination finalizer
    takes its NodeClaim with it and the NodePool replaces it; a retire then changes nothing."""
    victim = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"][0]
    claim = next(c for c in backend.claims() if c.node == victim)
    controlplane.delete_node(lab, victim)
    wait_for(
        lambda: all(c.name != claim.name for c in backend.claims()), 60, "Karpenter to end the NodeClaim"
    )
    (first,) = backend.retire([victim])
    assert first.ok and not first.changed, first.detail
    wait_for(lambda: (up := _pool_up(lab)) and victim not in up["kp"], UP_TIMEOUT, "the replacement")


def test_reboot_is_not_supported(lab: controlplane.KubeHandle, backend: KarpenterBackend) -> None:
    nodes = wait_for(lambda: _pool_up(lab), UP_TIMEOUT, "the pool")["kp"]
    results = backend.reboot(nodes[:2], timeout=5)
    assert [r.node for r in results] == nodes[:2]
    assert all(not r.ok and not r.changed and "no reboot" in r.detail for r in results)


def test_refuses_a_node_karpenter_did_not_launch(
    lab: controlplane.KubeHandle, backend: KarpenterBackend
) -> None:
    controlplane.add_nodes(lab, [controlplane.KubeNodeSpec("hand-made", labels={lb.POOL_LABEL: "kp"})])
    (res,) = backend.retire(["hand-made"])
    assert not res.ok and not res.changed and "providerID" in res.detail
    assert "hand-made" in _nodes(lab)


def test_no_kubernetes_access_is_a_clear_error(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not: a kubeconfig\n")
    with pytest.raises(BackendError, match="kubeconfig"):
        KarpenterBackend(str(kubeconfig)).health([])
