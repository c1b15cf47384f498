"""The ladder's evidence step on the production path (ladder_backend dcgm) against real kubelets:
the role's tasks as the ladder runs them - an evidence Job on each node (autoheal.cluster.node_job),
the runner's file of the watcher's kernel lines, Prometheus - into the bundles; a Job that cannot
run is recorded in the bundle with its cause and the play goes on; a rerun starts no Job and
changes nothing.

The image: images/fake_gpu.py's `fake-gpu-tools` (busybox with stand-in nvidia-smi and dcgmi, as
tests/nodes/test_ladder_jobs.py imports it): nvidia-smi answers; dcgmi fails, as a real one does,
in a pod given no GPU (the evidence Job allocates none), which the bundle records with its exit
code. Prometheus here is an address nothing listens on (the real-Prometheus read is
tests/runbook/test_evidence_sources.py)."""

from __future__ import annotations

import json
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from images.build import build
from lab.nodes import cluster
from lab.nodes import node as lab_node
from remediation import kernel_lines
from tests.nodes.conftest import Cluster
from tests.runbook.conftest import REPO, VENV_BIN, ansible_env
from tests.support import port_base

NODES = ["rn-1", "rn-2"]
INCIDENTS = {"rn-1": "inc-0000000000e1", "rn-2": "inc-0000000000e2"}
XID_LINE = "2026-12-03T16:40:00.000000Z NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
NOWHERE = f"http://127.0.0.1:{port_base(26502)}"  # no Prometheus listens here
MISSING_IMAGE = "localhost/autoheal/absent@sha256:" + "e" * 64
PURPOSE = "autoheal.io/job-purpose=evidence"


@pytest.fixture(scope="module")
def tools(real_cluster: Cluster) -> str:
    """The fake GPU tools image on both nodes; its reference (by digest)."""
    built = build(["fake-gpu-tools"])[0]
    for name in NODES:
        lab_node.import_image(real_cluster.ctx, cluster.spec(real_cluster.run_dir, name), built)
    return built.ref


def play(tmp: Path, c: Cluster, img: str, nodes: list[str], **extra: Any) -> tuple[int, str]:
    """Run roles/ladder/tasks/evidence.yml as the ladder includes it; (rc, output)."""
    lines = kernel_lines.write(tmp / "kernel-lines.json", {"rn-1": [XID_LINE], "rn-2": []})
    ladder = {
        "ladder_backend": "dcgm",
        "ladder_nodes": nodes,
        "ladder_incidents": INCIDENTS,
        "ladder_xid": 79,
        "ladder_gpu": 0,
        "ladder_kubeconfig": str(c.kubeconfig),
        "ladder_dcgm_namespace": "default",
        "ladder_dcgm_image": img,
        "ladder_evidence_dir": str(tmp / "evidence"),
        "ladder_journal": str(tmp / "journal.jsonl"),
        "ladder_kernel_lines": str(lines),
        "ladder_prometheus_url": NOWHERE,
        "ladder_evidence_timeout": 60,
        **extra,
    }
    book = tmp / "evidence.yml"
    book.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "evidence",
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                    "tasks": [
                        {
                            "ansible.builtin.include_role": {"name": "ladder", "tasks_from": "evidence"},
                            "vars": ladder,
                        }
                    ],
                }
            ]
        )
    )
    argv = [str(VENV_BIN / "ansible-playbook"), str(book)]
    res = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=300)
    return res.returncode, res.stdout + res.stderr


def bundle(tmp: Path, node: str) -> dict[str, str]:
    name = f"{INCIDENTS[node]}-{node}"
    with tarfile.open(tmp / "evidence" / f"{name}.tar.gz") as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.isfile()
        }


def evidence_jobs(c: Cluster) -> list[str]:
    r = c.http.get("/apis/batch/v1/namespaces/default/jobs", params={"labelSelector": PURPOSE})
    r.raise_for_status()
    return [j["metadata"]["name"] for j in r.json()["items"]]


def snapshot(tmp: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in (tmp / "evidence").rglob("*")}


def test_the_evidence_of_real_nodes_comes_from_jobs_on_them_and_a_failure_is_recorded(
    real_cluster, tools, tmp_path
):
    c, img = real_cluster, tools
    t0 = time.monotonic()
    rc, out = play(tmp_path, c, img, NODES)
    assert rc == 0, out[-3000:]
    took = time.monotonic() - t0
    for node in NODES:
        files = bundle(tmp_path, node)
        summary = json.loads(files["summary.json"])
        job = summary["evidence_job"]
        assert job["ok"] and job["job"].startswith(f"autoheal-evidence-{node}-"), json.dumps(summary)
        assert set(job["sections"]) == {"nvidia-smi -q", "dcgmi health -c -j"}, job
        assert job["sections"] == {"nvidia-smi -q": 0, "dcgmi health -c -j": 1}, job
        assert files["nvidia_smi_q.txt"].startswith("nvidia-smi -q\n")  # what the node's tool printed
        assert "no GPU is visible" in files["dcgm_health.json"]
        assert "dcgmi health -c -j: exit code 1" in summary["missing"]
        assert any(m.startswith(f"prometheus: {NOWHERE}: ") for m in summary["missing"]), summary
        assert (XID_LINE in files["xid_lines.txt"]) == (node == "rn-1")
    events = [json.loads(ln) for ln in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert {(e["node"], e["phase"], e["status"]) for e in events} == {(n, "evidence", "ok") for n in NODES}
    assert evidence_jobs(c) == []  # Jobs that worked are deleted
    print(f"\n[evidence] 2 real nodes' bundles in {took:.1f}s")

    # a second run: the bundles are kept, no Job is started, nothing changes
    before = snapshot(tmp_path)
    rc, out = play(tmp_path, c, img, NODES)
    assert rc == 0 and "changed=0" in out, out[-3000:]
    assert snapshot(tmp_path) == before and evidence_jobs(c) == []

    # a Job that cannot start (its image is nowhere): recorded with the cause, the play goes on
    INCIDENTS["rn-2"] = "inc-0000000000e3"
    try:
        rc, out = play(tmp_path, c, MISSING_IMAGE, ["rn-2"], ladder_evidence_pending_timeout=10)
        assert rc == 0, out[-3000:]
        summary = json.loads(bundle(tmp_path, "rn-2")["summary.json"])
        assert summary["evidence_job"]["ok"] is False, summary
        why = next(m for m in summary["missing"] if m.startswith("node_report: "))
        assert "Pending" in why and ("image" in why.lower() or "pull" in why.lower()), why
        assert evidence_jobs(c) == []  # stopped for its timeout: deleted, it cannot run later
    finally:
        INCIDENTS["rn-2"] = "inc-0000000000e2"
