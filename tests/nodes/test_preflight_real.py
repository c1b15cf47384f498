"""`autoheal preflight` passes on the real-node cluster used as an existing cluster: a stack file
as a user writes one for it (its kubeconfig, its pool, tolerations for the GPU taint the system
pods share the nodes under), none of the lab's own settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from components.preflight import load_stack, preflight
from tests.nodes.conftest import GPUS, TAINT, Cluster

ROOT = Path(__file__).resolve().parents[2]
AUTOHEAL = Path(sys.executable).parent / "autoheal"


def test_the_real_node_cluster_passes_the_preflight(real_cluster: Cluster, tmp_path: Path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    config = {
        "autoheal:cluster": {"backend": "kubeconfig", "kubeconfig": str(real_cluster.kubeconfig)},
        "autoheal:pools": [
            {"name": "h100", "gpuModel": "h100", "gpusPerNode": GPUS, "size": 1, "spares": 1, "taints": TAINT}
        ],
        # two nodes, both GPU nodes: Slurm's controller and the runner tolerate the GPU taint
        "autoheal:slurm": {"tolerateTaints": TAINT},
        "autoheal:runner": {"tolerateTaints": TAINT},
    }
    (tmp_path / "Pulumi.existing.yaml").write_text(yaml.safe_dump({"config": config}))
    report = preflight(load_stack(tmp_path, "existing"), tmp_path, "existing")
    assert report.ok, report.text()
    statuses = {c.name: c.status for c in report.checks}
    # the real nodes share this host's cgroup hierarchy: v1 shows as their kubelets' CgroupV1 event
    # (the lab's kubelets run with failCgroupV1: false), v2 is not observable from the API
    v1 = (
        subprocess.run(["stat", "-fc", "%T", "/sys/fs/cgroup"], capture_output=True, text=True).stdout.strip()
        != "cgroup2fs"
    )
    assert statuses == {
        "cluster reachable": "pass",
        "server version": "pass",
        "kubelet versions": "pass",
        "node OS, cgroups": "warn" if v1 else "info",
        "pool h100: nodes": "pass",
        "pool h100: labels, taints": "pass",
        "pool h100: GPUs": "pass",
        "storage: default class": "pass",
        "system node: slurmctld, login": "pass",
        "system node: runner": "pass",
    }, report.text()
    rows = {c.name: c.detail for c in report.checks}
    # the real kubelets' device plugin advertises the GPUs; the lab's provisioner is the default class
    assert rows["pool h100: GPUs"] == f"every node advertises at least {GPUS} nvidia.com/gpu"
    assert rows["storage: default class"].startswith("lab-hostpath")
    assert "containerd://" in rows["node OS, cgroups"]
    if v1:
        assert rows["node OS, cgroups"].startswith("cgroup v1 on rn-1, rn-2 (their kubelets' CgroupV1 event)")
    else:
        assert "cgroup version: not observable from the Kubernetes API" in rows["node OS, cgroups"]
    assert report.seconds < 5, report.seconds
    # the command a user runs prints the same as a table, exit 0
    res = subprocess.run(
        [AUTOHEAL, "preflight", "--stack", "existing", "--project", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"},
    )
    print(res.stdout + res.stderr)
    assert res.returncode == 0 and "preflight ok" in res.stderr, res.stdout + res.stderr
