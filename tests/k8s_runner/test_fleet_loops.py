"""The spare keeper on a real API server as the runner's ServiceAccount (issue 32, Deliver 4): its
RBAC exactly as RemediationRunner(spare_keeper=True) declares it, a pool declared the way
GpuNodePool writes it (a ConfigMap with pool.json), KWOK nodes joining the pool, real Slurm (the
lab's) read on every pass. The decision table itself: tests/remediation/test_rem_spares.py; dead
nodes on real nodes and real dynamic Slurm: tests/nodes/test_dead_node_cleanup.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import JOINING_REASON, OPT_OUT_LABEL, SPARE_REASON
from lab.controlplane import KWOK_ANNOTATION, KWOK_ANNOTATION_VALUE
from remediation.cordon_sync import SlurmCli, SyncJournal
from remediation.notify import SpareShortage
from remediation.spares import KubePools, SpareKeeper
from tests.k8s_runner.conftest import RUNNER_NS, RUNNER_SA, Identity
from tests.runbook.conftest import Lab
from tests.support import wait_for

pytestmark = pytest.mark.lab

POOL = "kp"  # a pool of this test's own: the lab's nodes (other tests') are never members
RUNNER_USER = f"system:serviceaccount:{RUNNER_NS}:{RUNNER_SA}"


def _pool_rbac() -> list[dict[str, Any]]:
    """The Role and RoleBinding the component adds for the spare keeper (its own output)."""
    from components.runner import RemediationRunner, RemediationRunnerArgs
    from review.mockstack import run_program

    def program() -> dict[str, Any]:
        RemediationRunner("runner", RemediationRunnerArgs(namespace=RUNNER_NS, spare_keeper=True))
        return {}

    objs = [dict(r.inputs) for r in run_program(program).resources]
    return [
        o
        for o in objs
        if o.get("kind") in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-pools")
    ]


def _pool_configmap(spares: int) -> dict[str, Any]:
    doc = {
        "name": POOL,
        "spares": spares,
        "size": 2,
        "spare": {
            "label": {"key": "autoheal.io/spare", "value": "true"},
            "taint": {"key": "autoheal.io/spare", "value": "true", "effect": "NoSchedule"},
        },
        "nodeNames": {"active": [], "spares": [], "future": []},
        "remediation": {"enabled": True, "waiver": None},
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"autoheal-pool-{POOL}",
            "namespace": RUNNER_NS,
            "labels": {"app.kubernetes.io/component": "node-pool", "autoheal.io/pool": POOL},
        },
        "data": {"pool.json": json.dumps(doc)},
    }


def _kwok_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"autoheal.io/pool": POOL, "type": "kwok"},
            "annotations": {KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE},
        },
    }


def _add_ready(lab: Lab, *names: str) -> None:
    lab.kubectl(
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [_kwok_node(n) for n in names]}),
    )

    def ready() -> bool:
        for n in names:
            node = lab.kube_node(n) or {}
            conds = (node.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                return False
        return True

    wait_for(ready, 30, f"KWOK nodes {names} Ready")


def _marks(lab: Lab, name: str) -> tuple[str | None, str | None, bool]:
    node = lab.kube_node(name) or {}
    labels = node["metadata"].get("labels") or {}
    tainted = any(t["key"] == "autoheal.io/spare" for t in node["spec"].get("taints") or [])
    return labels.get("autoheal.io/state"), labels.get("autoheal.io/spare"), tainted


def test_the_spare_keeper_keeps_a_declared_pools_spares_as_the_runner(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Path
) -> None:
    lab = kube_lab
    lab.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": _pool_rbac()})
    )
    lab.kubectl("apply", "-f", "-", stdin=json.dumps(_pool_configmap(spares=1)))
    pages: list[dict[str, Any]] = []
    shortage = SpareShortage(lambda event, **f: pages.append({"event": event, **f}))
    counts: dict[str, tuple[int, int]] = {}

    def report(pool: str, spares: int, declared: int) -> None:
        counts[pool] = (spares, declared)
        shortage.level(pool, spares, declared)

    keeper = SpareKeeper(
        KubePools(runner_identity.kubeconfig),
        SlurmCli(lab.slurm_conf),  # the lab's Slurm knows no kp node: only Kubernetes changes
        SyncJournal(tmp_path / "spare-keeper.jsonl"),
        RUNNER_NS,
        OPT_OUT_LABEL,
        report=report,
    )
    try:
        _add_ready(lab, "kp-1")
        _add_ready(lab, "kp-2")  # created later: kp-1 is the older new node
        done = keeper.reconcile()
        assert [(a.node, a.verb) for a in done if a.pool == POOL] == [("kp-1", "spare"), ("kp-2", "active")]
        assert _marks(lab, "kp-1") == ("spare", "true", True)
        assert _marks(lab, "kp-2") == ("active", None, False)
        assert counts[POOL] == (1, 1) and pages == []
        assert [a for a in keeper.reconcile() if a.pool == POOL] == []  # a second pass: nothing

        # roles/node_pool promotes kp-1 (state active, spare label and taint off): none left, one page
        lab.kubectl("label", "node", "kp-1", "autoheal.io/state=active", "autoheal.io/spare-", "--overwrite")
        lab.kubectl("taint", "node", "kp-1", "autoheal.io/spare-")
        keeper.reconcile()
        keeper.reconcile()
        assert counts[POOL] == (0, 1)
        assert [(p["event"], p["pool"]) for p in pages] == [("pool.spares_exhausted", POOL)]

        # the backend's replacement joins: it becomes the spare, the count is restored
        _add_ready(lab, "kp-3")
        assert [(a.node, a.verb) for a in keeper.reconcile() if a.pool == POOL] == [("kp-3", "spare")]
        assert _marks(lab, "kp-3") == ("spare", "true", True) and counts[POOL] == (1, 1)
        assert _marks(lab, "kp-1") == ("active", None, False)  # the promotion stands
        rows = [json.loads(x) for x in (tmp_path / "spare-keeper.jsonl").read_text().splitlines()]
        assert [(r["node"], r["action"]) for r in rows] == [
            ("kp-1", "spare"),
            ("kp-2", "active"),
            ("kp-3", "spare"),
        ]
    finally:
        lab.kubectl("delete", "node", "kp-1", "kp-2", "kp-3", "--ignore-not-found", check=False)
        lab.kubectl(
            "delete", "configmap", "-n", RUNNER_NS, f"autoheal-pool-{POOL}", "--ignore-not-found", check=False
        )


def test_the_spare_keeper_drains_and_resumes_in_real_slurm(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Path
) -> None:
    """Two of the lab's nodes join a pool of this test (declaring one spare) drained `autoheal:
    joining`, as a cloud's bridge registers new capacity: the older becomes the spare (drained with
    exactly the spare reason in the lab's real Slurm), the other active (resumed). Both are put
    back as they were afterwards (other tests of this lab use them)."""
    lab = kube_lab
    pool, nodes = "kq", ("gpu-3", "gpu-4")
    lab.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": _pool_rbac()})
    )
    cm = _pool_configmap(spares=1)
    cm["metadata"]["name"] = f"autoheal-pool-{pool}"
    cm["data"]["pool.json"] = cm["data"]["pool.json"].replace(f'"name": "{POOL}"', f'"name": "{pool}"')
    slurm = SlurmCli(lab.slurm_conf)
    keeper = SpareKeeper(
        KubePools(runner_identity.kubeconfig),
        slurm,
        SyncJournal(tmp_path / "spare-keeper.jsonl"),
        RUNNER_NS,
        OPT_OUT_LABEL,
    )
    try:
        lab.kubectl("apply", "-f", "-", stdin=json.dumps(cm))
        lab.slurm(
            "scontrol", "update", f"nodename={','.join(nodes)}", "state=drain", f"reason={JOINING_REASON}"
        )
        lab.kubectl("label", "node", *nodes, f"autoheal.io/pool={pool}", "--overwrite")
        done = [(a.node, a.verb, a.slurm) for a in keeper.reconcile() if a.pool == pool]
        assert done == [("gpu-3", "spare", "drain"), ("gpu-4", "active", "resume")]
        now = slurm.nodes()
        assert (now["gpu-3"].drained, now["gpu-3"].reason) == (True, SPARE_REASON)
        assert not now["gpu-4"].drained
        assert _marks(lab, "gpu-3") == ("spare", "true", True) and _marks(lab, "gpu-4") == (
            "active",
            None,
            False,
        )
        assert [a for a in keeper.reconcile() if a.pool == pool] == []
    finally:
        lab.kubectl(
            "delete", "configmap", "-n", RUNNER_NS, f"autoheal-pool-{pool}", "--ignore-not-found", check=False
        )
        lab.kubectl(
            "label",
            "node",
            *nodes,
            "autoheal.io/pool=h100",
            "autoheal.io/state-",
            "autoheal.io/spare-",
            "--overwrite",
            check=False,
        )
        lab.kubectl("taint", "node", "gpu-3", "autoheal.io/spare-", check=False)
        lab.slurm("scontrol", "update", f"nodename={','.join(nodes)}", "state=resume", check=False)
