"""Kubernetes and Slurm in step both ways (issue 14, Deliver 4): the cordon sync against a real API
server (as the runner's ServiceAccount) and real Slurm. The decision table is tested first without
a cluster, then the watch loop end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from remediation.cordon_sync import (
    DEFAULT_IGNORED_TAINTS,
    SYNC_REASON,
    CordonSync,
    KubeNode,
    KubeNodes,
    SlurmCli,
    SlurmNode,
    SyncJournal,
    decide,
    parse_sinfo,
)
from tests.k8s_runner.conftest import Identity
from tests.runbook.conftest import Lab
from tests.support import wait_for

IGNORE = DEFAULT_IGNORED_TAINTS
IDLE = SlurmNode("n", drained=False, reason="")


def _node(**kw: Any) -> KubeNode:
    return KubeNode("n", **kw)


@pytest.mark.parametrize(
    ("k", "s", "want"),
    [
        (_node(unschedulable=True), IDLE, ("drain", SYNC_REASON)),
        (
            _node(taints=(("maint", "bios", "NoExecute"),)),
            IDLE,
            ("drain", f"{SYNC_REASON} (taint maint=bios:NoExecute)"),
        ),
        (_node(taints=(("maint", "", "PreferNoSchedule"),)), IDLE, None),  # a preference holds nothing
        (_node(taints=(("nvidia.com/gpu", "present", "NoSchedule"),)), IDLE, None),  # the pool's own taint
        (_node(taints=(("node.kubernetes.io/unschedulable", "", "NoSchedule"),)), IDLE, None),
        (_node(unschedulable=True), SlurmNode("n", True, "admin: bios"), None),  # already drained: no change
        (_node(), SlurmNode("n", True, "admin: bios"), None),  # an admin's drain is never resumed
        (_node(), SlurmNode("n", True, SYNC_REASON), ("resume", SYNC_REASON)),
        (_node(), SlurmNode("n", True, "autoheal: XID 79 gpu3 inc-1"), None),  # the runbook's fence
        (_node(unschedulable=True, labels={"autoheal.io/state": "quarantined"}), IDLE, None),
        (_node(labels={"autoheal.io/spare": "true"}), SlurmNode("n", True, SYNC_REASON), None),
        (_node(unschedulable=True), None, None),  # not a Slurm node
    ],
)
def test_the_decision_table(k: KubeNode, s: SlurmNode | None, want: tuple[str, str] | None) -> None:
    action = decide(k, s, IGNORE)
    assert (None if action is None else (action.verb, action.reason)) == want


def test_sinfo_json_of_both_slurm_versions_is_read() -> None:
    old = {"nodes": [{"name": "a", "state": "idle", "state_flags": ["DRAIN"], "reason": "x"}]}
    new = {
        "nodes": [{"name": "b", "state": ["IDLE", "DRAIN"], "reason": "y"}, {"name": "c", "state": ["DOWN"]}]
    }
    assert parse_sinfo(json.dumps(old))["a"] == SlurmNode("a", True, "x")
    assert parse_sinfo(json.dumps(new))["b"] == SlurmNode("b", True, "y")
    assert parse_sinfo(json.dumps(new))["c"].drained


def _slurm(lab: Lab, name: str) -> SlurmNode:
    return SlurmCli(lab.slurm_conf).nodes()[name]


@pytest.mark.lab
def test_cordon_and_taint_by_hand_drain_in_slurm_and_lifting_them_resumes(
    kube_lab: Lab, runner_identity: Identity, tmp_path: Path
) -> None:
    lab = kube_lab
    journal = SyncJournal(tmp_path / "cordon-sync.jsonl")
    sync = CordonSync(
        KubeNodes(runner_identity.kubeconfig), SlurmCli(lab.slurm_conf), journal, resync_seconds=8
    )
    lab.slurm("scontrol", "update", "nodename=gpu-2", "state=drain", "reason=admin: bios update")
    sync.start()
    latencies: list[float] = []
    try:
        wait_for(lambda: sync.listed_at is not None, 30, f"the sync's first list ({sync.last_error})")

        def until(pred: Any, what: str) -> float:
            t0 = time.monotonic()
            wait_for(pred, 30, what, interval=0.05)
            return time.monotonic() - t0

        lab.kubectl("cordon", "gpu-3")
        latencies.append(until(lambda: _slurm(lab, "gpu-3").reason == SYNC_REASON, "gpu-3 drained in Slurm"))
        assert _slurm(lab, "gpu-3").drained
        lab.kubectl("uncordon", "gpu-3")
        latencies.append(until(lambda: not _slurm(lab, "gpu-3").drained, "gpu-3 resumed in Slurm"))
        assert _slurm(lab, "gpu-3").reason == ""

        lab.kubectl("taint", "node", "gpu-4", "maint=psu:NoSchedule")
        latencies.append(until(lambda: _slurm(lab, "gpu-4").drained, "gpu-4 drained for its taint"))
        assert _slurm(lab, "gpu-4").reason == f"{SYNC_REASON} (taint maint=psu:NoSchedule)"
        lab.kubectl("taint", "node", "gpu-4", "maint-")
        latencies.append(until(lambda: not _slurm(lab, "gpu-4").drained, "gpu-4 resumed"))

        # an admin's own drain: cordon and uncordon change nothing of it
        lab.kubectl("cordon", "gpu-2")
        lab.kubectl("uncordon", "gpu-2")
        lab.kubectl("cordon", "gpu-3")  # a marker: once gpu-3 is drained, gpu-2's events were seen
        until(lambda: _slurm(lab, "gpu-3").drained, "gpu-3 drained again")
        assert _slurm(lab, "gpu-2") == SlurmNode("gpu-2", True, "admin: bios update")

        # a change in Slurm alone is put right at the next resync: an admin resumes gpu-3 while it
        # is still cordoned, and it is drained again
        lab.slurm("scontrol", "update", "nodename=gpu-3", "state=resume")
        until(lambda: _slurm(lab, "gpu-3").drained, "gpu-3 drained again after the resync")
        lab.kubectl("uncordon", "gpu-3")
        until(lambda: not _slurm(lab, "gpu-3").drained, "gpu-3 resumed at last")

        rows = [json.loads(line) for line in journal.path.read_text().splitlines()]
        assert [(r["node"], r["action"]) for r in rows[:4]] == [
            ("gpu-3", "drain"),
            ("gpu-3", "resume"),
            ("gpu-4", "drain"),
            ("gpu-4", "resume"),
        ]
        assert all(r["node"] != "gpu-2" for r in rows)
        assert all(r["seconds"] < 5 for r in rows[:4]), rows
        # event driven, not the resync (8 s here): a broken watch would show as seconds
        assert max(latencies) < 2.5, latencies
        print(
            f"cordon sync latency (kubectl returns -> Slurm shows it), s: {[round(x, 2) for x in latencies]}"
        )
        print(f"cordon sync journal seconds (watch event -> scontrol done): {[r['seconds'] for r in rows]}")
    finally:
        sync.stop()
        lab.slurm("scontrol", "update", "nodename=gpu-2", "state=resume", check=False)
        for n in ("gpu-2", "gpu-3"):
            lab.kubectl("uncordon", n, check=False)
        lab.kubectl("taint", "node", "gpu-4", "maint-", check=False)
        assert sync._thread is not None
        sync._thread.join(15)


def test_the_sync_reads_each_nodes_own_reason_on_slurm_24(tmp_path, monkeypatch):
    """24.11's `sinfo --json` (captured on the pods lab) groups a fenced node with two spares
    under one reason and has no "nodes" list; the sync then reads `scontrol show nodes --json`,
    so an admin's drain and autoheal's stay told apart."""
    data = Path(__file__).resolve().parents[1] / "data"
    outputs = {
        "sinfo": (data / "slurm-24.11-sinfo-json-grouped.json").read_text(),
        "scontrol": (data / "slurm-24.11-scontrol-show-nodes-json.json").read_text(),
    }
    ran: list[str] = []
    cli = SlurmCli(None)

    def run(*argv: str) -> str:
        ran.append(argv[0])
        return outputs[argv[0]]

    monkeypatch.setattr(cli, "_run", run)
    nodes = cli.nodes()
    # the pods lab's nodes are dynamic (`slurmd -Z`: DYNAMIC_NORM), which the dead-node loop reads
    assert nodes["gpu-2"] == SlurmNode("gpu-2", True, "autoheal: hot spare", dynamic=True)
    assert nodes["gpu-3"] == SlurmNode("gpu-3", True, "autoheal: XID 79 gpu3 inc-0123456789ab", dynamic=True)
    cli.nodes()
    assert ran == ["sinfo", "scontrol", "scontrol"]
