"""The lender as the runner's ServiceAccount on a real API server, with the lab's real Slurm (issue
35): every call it makes is allowed by the RBAC RemediationRunner declares (nodes patch, pods list
in every namespace, the Eviction API, Events), and its limits hold on real objects: a burst bigger
than the lendable capacity lends up to the limit and says so once, an admin's Slurm drain is never
taken, a pod that lands on a node being returned is evicted, and a node whose Slurm record outlived
the lend (here: the lab's slurmd is a host process, not a pod) is resumed. The lend and return on
real kubelets with slurmd in pods: tests/k8s_slurm/test_lending.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import LEND_LABEL, LEND_MOVED_ANNOTATION, LEND_REASON, OPT_OUT_LABEL
from remediation.cordon_sync import SlurmCli, SyncJournal
from remediation.lender import KubeLending, Lender, SlurmLending
from remediation.lending import Policy
from tests.k8s_runner.conftest import Identity
from tests.runbook.conftest import Lab
from tests.support import wait_for

pytestmark = pytest.mark.lab

POOL, PC, NODES = "kl", "inference-kl", ("gpu-3", "gpu-4")
POLICY = Policy(
    max_nodes=2, max_percent=100, min_training=0, cooldown=0, return_after=0, grace=5, pools=frozenset({POOL})
)


def _pod(name: str, gpus: int, node: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "priorityClassName": PC,
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {"name": "c", "image": "serve", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def _apply(lab: Lab, *objs: dict[str, Any]) -> None:
    lab.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)})
    )


def _side(lab: Lab, name: str) -> tuple[str | None, bool]:
    node = lab.kube_node(name) or {}
    return (node["metadata"].get("labels") or {}).get(LEND_LABEL), bool(node["spec"].get("unschedulable"))


def test_the_lender_as_the_runner_limits_a_burst_never_takes_an_admins_drain_and_evicts(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Path
) -> None:
    lab = kube_lab
    slurm = SlurmCli(lab.slurm_conf)
    notes: list[dict[str, Any]] = []
    lender = Lender(
        KubeLending(runner_identity.kubeconfig),
        SlurmLending(lab.slurm_conf),
        SyncJournal(tmp_path / "lending.jsonl"),
        POLICY,
        PC,
        OPT_OUT_LABEL,
        notify=lambda event, **f: notes.append({"event": event, **f}),
    )
    try:
        _apply(
            lab,
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": PC},
                "value": 1000,
                "preemptionPolicy": "Never",
            },
        )
        lab.kubectl("label", "node", *NODES, f"autoheal.io/pool={POOL}", "--overwrite")
        lab.slurm("scontrol", "update", "nodename=gpu-4", "state=drain", "reason=admin: fan noise")
        _apply(lab, _pod("burst", 64))  # far beyond any node: Pending, and beyond what may be lent

        # dry run: the move is journalled once, nothing changes
        dry = Lender(
            KubeLending(runner_identity.kubeconfig),
            SlurmLending(lab.slurm_conf),
            SyncJournal(tmp_path / "dry.jsonl"),
            POLICY,
            PC,
            OPT_OUT_LABEL,
            dry_run=True,
        )
        dry.reconcile()
        dry.reconcile()
        rows = [json.loads(x) for x in (tmp_path / "dry.jsonl").read_text().splitlines()]
        assert [(r["node"], r["action"], r["dry_run"]) for r in rows if r.get("node")] == [
            ("gpu-3", "lend", True)
        ]
        assert _side(lab, "gpu-3") == (None, False) and not slurm.nodes()["gpu-3"].drained

        moves = [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL]
        assert moves == [("gpu-3", "lend")]  # gpu-4 is the admin's
        now = slurm.nodes()
        assert (now["gpu-3"].drained, now["gpu-3"].reason) == (True, LEND_REASON)
        assert (now["gpu-4"].drained, now["gpu-4"].reason) == (True, "admin: fan noise")
        assert _side(lab, "gpu-3") == ("lending", False)
        assert LEND_MOVED_ANNOTATION in (lab.kube_node("gpu-3") or {})["metadata"]["annotations"]
        assert [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL] == [("gpu-3", "lent")]
        assert _side(lab, "gpu-3") == ("lent", False)
        lender.reconcile()
        shorts = [n for n in notes if n["event"] == "lending.short"]
        assert len(shorts) == 1 and "beyond what may be lent" in shorts[0]["reason"], notes  # said once

        # the burst ends: the node is taken back (cooldown and idle time 0 here)
        lab.kubectl("delete", "pod", "-n", "default", "burst", "--wait=false")
        wait_for(
            lambda: "burst" not in lab.kubectl("get", "pods", "-n", "default", "-o", "name"), 30, "burst gone"
        )
        assert [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL] == [("gpu-3", "return")]
        assert _side(lab, "gpu-3") == ("returning", True)
        # a pod bound to it meanwhile (nodeName passes a cordon) is evicted, as the runner
        _apply(lab, _pod("straggler", 1, node="gpu-3"))
        wait_for(
            lambda: "straggler" in lab.kubectl("get", "pods", "-n", "default", "-o", "name"), 30, "straggler"
        )
        assert [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL] == [("gpu-3", "evict")]
        wait_for(
            lambda: "straggler" not in lab.kubectl("get", "pods", "-n", "default", "-o", "name"),
            60,
            "evicted",
        )
        assert [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL] == [
            ("gpu-3", "returned")
        ]
        assert _side(lab, "gpu-3") == (None, False)
        # the lab's slurmd is a host process: its record outlived the lend, drained with our reason
        assert [(m.node, m.verb) for m in lender.reconcile().moves if m.pool == POOL] == [("gpu-3", "resume")]
        assert not slurm.nodes()["gpu-3"].drained
        assert slurm.nodes()["gpu-4"].reason == "admin: fan noise"  # never touched
        assert [m for m in lender.reconcile().moves if m.pool == POOL] == []

        events = json.loads(
            lab.kubectl(
                "get",
                "events",
                "-n",
                "default",
                "--field-selector",
                "involvedObject.name=gpu-3",
                "-o",
                "json",
            )
        )["items"]
        reasons = {
            e["reason"] for e in events if (e.get("source") or {}).get("component") == "autoheal-lender"
        }
        assert {
            "LendingToInference",
            "LentToInference",
            "ReturningToTraining",
            "ReturnedToTraining",
        } <= reasons
        assert lender.last_error is None
    finally:
        lab.kubectl("delete", "pod", "-n", "default", "burst", "straggler", "--ignore-not-found", check=False)
        lab.kubectl("delete", "priorityclass", PC, "--ignore-not-found", check=False)
        lab.kubectl(
            "label", "node", *NODES, "autoheal.io/pool=h100", f"{LEND_LABEL}-", "--overwrite", check=False
        )
        lab.kubectl("annotate", "node", *NODES, f"{LEND_MOVED_ANNOTATION}-", check=False)
        lab.kubectl("uncordon", *NODES, check=False)
        lab.slurm("scontrol", "update", f"nodename={','.join(NODES)}", "state=resume", check=False)
