"""The runner in its pod on a real node (issue 14, Deliver 2): the RemediationRunner component's
own objects (built under Pulumi mocks) applied to a lab with a real node (containerd + kubelet),
the runner image `autoheal images build` made from this checkout, and a slurmctld of the same
Slurm version (24.11, from the slurm image) in a pod beside it. The runner pod becomes Ready only
when its /readyz finds the API server (as its ServiceAccount) and slurmctld (through its munge
sidecar and slurm.conf); before slurmctld exists it is not Ready.

The lab's own slurmctld is a host process of Debian 12's Slurm 22.05, which a 24.11 client
cannot talk to; the SlurmCluster pods (components/slurm) run 24.11, as this test's slurmctld does.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.common import Taint
from lab import controlplane
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from lab.nodes import cluster
from tests.nodes.conftest import require_real_nodes
from tests.runbook.conftest import REPO
from tests.support import port_base, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]
NS = "autoheal"
KEY = base64.b64encode(os.urandom(1024)).decode()
SLURM_CONF = f"""ClusterName=b-pod
SlurmctldHost=slurmctld(slurmctld.{NS}.svc.cluster.local)
SlurmctldPort=6817
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=1
MailProg=/bin/true
NodeName=gpu-1 CPUs=1 State=FUTURE
PartitionName=gpu Nodes=ALL Default=YES
"""
GPU_TAINT = Taint(key="nvidia.com/gpu", value="present")


def _runner_objects(image: str) -> list[dict[str, Any]]:
    from components.runner import RemediationRunner, RemediationRunnerArgs
    from components.runner_pod import RunnerSlurmArgs
    from review.mockstack import run_program

    args = RemediationRunnerArgs(
        namespace=NS,
        image=image,
        rules_yaml=(REPO / "config" / "rules.yaml").read_text(),
        slurm=RunnerSlurmArgs(config={"slurm.conf": SLURM_CONF}, munge_key_base64=KEY),
        journal_storage_class="",  # a static volume of this test's own
        tolerate=(GPU_TAINT,),
        wait_for_rollout=False,
    )
    rec = run_program(lambda: RemediationRunner("runner", args))
    return [dict(r.inputs) for r in rec.resources if r.type.startswith("kubernetes:")]


def _slurmctld(image: str) -> list[dict[str, Any]]:
    """slurmctld 24.11 with munged, as root, the cluster's key and the runner's slurm.conf."""
    labels = {"app": "slurmctld"}
    start = (
        "install -d -o munge -g munge -m 0700 /etc/munge && "
        "install -o munge -g munge -m 0400 /key/munge.key /etc/munge/munge.key && "
        "install -d -o munge -g munge -m 0755 /run/munge && "
        "runuser -u munge -- munged && mkdir -p /var/spool/slurmctld && "
        "exec slurmctld -D -f /conf/slurm.conf"
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ctld-conf", "namespace": NS},
            "data": {"slurm.conf": SLURM_CONF},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "ctld-key", "namespace": NS},
            "data": {"munge.key": KEY},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "slurmctld", "namespace": NS},
            "spec": {"selector": labels, "ports": [{"port": 6817, "targetPort": 6817}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "slurmctld", "namespace": NS, "labels": labels},
            "spec": {
                "hostname": "slurmctld",
                "tolerations": [GPU_TAINT.as_dict() | {"operator": "Equal"}],
                "containers": [
                    {
                        "name": "slurmctld",
                        "image": image,
                        "command": ["bash", "-c", start],
                        "volumeMounts": [
                            {"name": "conf", "mountPath": "/conf"},
                            {"name": "key", "mountPath": "/key"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "conf", "configMap": {"name": "ctld-conf"}},
                    {"name": "key", "secret": {"secretName": "ctld-key"}},
                ],
            },
        },
    ]


def _journal_volume(root: Path) -> dict[str, Any]:
    path = root / "journal-pv"
    path.mkdir(exist_ok=True)
    from components.runner_pod import SLURM_USER_UID

    # fsGroup does not reach a hostPath volume; with Slurm access the runner runs as SlurmUser's uid
    os.chown(path, SLURM_USER_UID, SLURM_USER_UID)
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "b-runner-journal"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


@pytest.fixture(scope="module")
def pod_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    require_real_nodes()
    cfg = LabConfig(
        name="b-pod",
        root=tmp_path_factory.mktemp("bpod"),
        port_base=port_base(29300),
        pools=[PoolConfig(size=1, spares=0, headroom=1, gpus_per_node=2)],
        real_nodes=1,
        runner=False,
        watchers=False,
        provision_delay=1,
    )
    try:
        t0 = time.monotonic()
        labmod.up(cfg)
        print(f"\n[runner pod] lab with one real node up in {time.monotonic() - t0:.1f}s")
        yield cfg
    finally:
        labmod.down(cfg)


def _kubectl(cfg: LabConfig, *argv: str, stdin: str | None = None, check: bool = True) -> str:
    exe = str(controlplane.tool_bin_dir() / "kubectl")
    res = subprocess.run(
        [exe, f"--kubeconfig={cfg.kubeconfig}", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and res.returncode != 0:
        raise AssertionError(f"kubectl {argv}: {res.stderr}")
    return res.stdout


def _apply(cfg: LabConfig, objects: list[dict[str, Any]]) -> None:
    _kubectl(
        cfg, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    )


def _runner_pod(cfg: LabConfig) -> dict[str, Any] | None:
    pods = json.loads(
        _kubectl(cfg, "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=autoheal-runner", "-o", "json")
    )
    items = pods["items"]
    return items[0] if items else None


def _ready(pod: dict[str, Any] | None) -> bool:
    conds = {c["type"]: c["status"] for c in ((pod or {}).get("status") or {}).get("conditions") or []}
    return conds.get("Ready") == "True"


def test_the_runner_pod_runs_on_a_real_node_and_is_ready_only_when_it_reaches_both(
    pod_lab: LabConfig, tmp_path: Path
) -> None:
    cfg = pod_lab
    images = {i.name: i.ref for i in cluster.context(cfg.run_dir).images}
    _apply(cfg, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    controlplane.wait_service_account(cfg.kubeconfig, NS, "default", 60)
    _apply(cfg, [_journal_volume(tmp_path)])
    t0 = time.monotonic()
    _apply(cfg, _runner_objects(images["runner"]))

    def refused_for_503() -> str:
        pod = _runner_pod(cfg)
        if pod is None:
            return ""
        events = _kubectl(
            cfg,
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            f"involvedObject.name={pod['metadata']['name']}",
        )
        return events if "statuscode: 503" in events else ""

    # the runner serves, and its /readyz says no: there is no slurmctld yet
    events = wait_for(
        refused_for_503, 300, "a readiness probe answered 503 (the runner up, slurmctld missing)"
    )
    started = time.monotonic() - t0
    pod = _runner_pod(cfg)
    assert pod is not None and not _ready(pod), events
    restarts = [c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []]
    assert restarts == [0], f"the runner restarted: {restarts}"

    _apply(cfg, _slurmctld(images["slurm"]))
    t1 = time.monotonic()
    wait_for(lambda: _ready(_runner_pod(cfg)), 180, "the runner pod Ready once slurmctld answers")
    ready_after_ctld = time.monotonic() - t1
    pod = _runner_pod(cfg)
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    name = pod["metadata"]["name"]
    # the runner's view from inside its pod: its identity and slurmctld, as /readyz checks them
    state = "/var/lib/autoheal/state/incluster.kubeconfig"
    who = _kubectl(cfg, "exec", "-n", NS, name, "-c", "runner", "--", "cat", state)
    assert "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token" in who
    ping = _kubectl(cfg, "exec", "-n", NS, name, "-c", "runner", "--", "scontrol", "ping")
    assert "is UP" in ping, ping
    print(
        f"[runner pod] objects applied -> runner container started: {started:.1f}s; "
        f"slurmctld pod created -> runner Ready: {ready_after_ctld:.1f}s"
    )
