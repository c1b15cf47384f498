"""SlurmCluster: configuration generated from the pools, persistent controller state, login with
SSH keys, shared storage, and one slurmd DaemonSet per pool placed on that pool's nodes."""

from __future__ import annotations

from typing import Any

import pytest

from autoheal.labels import SPARE_REASON
from autoheal.slurmconf import range_names
from components.nodepool import GpuNodePool, GpuNodePoolArgs
from components.slurm import STATE_DIR, SlurmCluster, SlurmClusterArgs, SlurmImages
from tests.components.harness import Recorded, pod_spec, run_program


def _conf(lab: Recorded, key: str) -> str:
    return str(lab.one("kubernetes:core/v1:ConfigMap", "slurm-config").inputs["data"][key])


def _node_lines(conf: str) -> dict[str, str]:
    """Node name -> the NodeName line whose hostlist run covers it."""
    return {
        node: line
        for line in conf.splitlines()
        if line.startswith("NodeName=")
        for node in range_names(line.split()[0].removeprefix("NodeName="))
    }


def test_slurm_conf_lists_every_node_of_the_pool_with_its_gres(lab):
    nodes = _node_lines(_conf(lab, "slurm.conf"))
    assert list(nodes) == [f"gpu-{i}" for i in range(1, 13)]
    assert all("Gres=gpu:h100:8" in line and "Feature=pool_h100" in line for line in nodes.values())


def test_spares_are_drained_with_our_reason_and_headroom_is_future(lab):
    nodes = _node_lines(_conf(lab, "slurm.conf"))
    for n in ("gpu-1", "gpu-2", "gpu-3", "gpu-4"):
        assert "State=" not in nodes[n]
    for n in ("gpu-5", "gpu-6"):
        assert f'State=DRAIN Reason="{SPARE_REASON}"' in nodes[n]
    for i in range(7, 13):
        assert nodes[f"gpu-{i}"].endswith("State=FUTURE")


def test_controller_address_and_state_location(lab):
    conf = _conf(lab, "slurm.conf")
    assert "SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.slurm.svc.cluster.local)" in conf
    assert f"StateSaveLocation={STATE_DIR}" in conf
    assert "PartitionName=h100 Nodes=gpu-[1-12] " in conf
    assert "TopologyPlugin=topology/tree" in conf


def test_gres_and_topology_conf_per_pool(lab):
    gres = _conf(lab, "gres.conf").splitlines()
    assert "NodeName=gpu-[1-12] Name=gpu Type=h100 File=/dev/nvidia[0-7]" in gres
    topo = _conf(lab, "topology.conf")
    assert "SwitchName=h100 Nodes=gpu-1,gpu-2," in topo
    assert "SwitchName=root Switches=h100" in topo


def test_controller_state_is_on_a_persistent_volume_claim(lab):
    sts = lab.one("kubernetes:apps/v1:StatefulSet", "slurmctld")
    spec = sts.inputs["spec"]
    (template,) = spec["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "state"
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    ctld = next(c for c in spec["template"]["spec"]["containers"] if c["name"] == "slurmctld")
    assert {"name": "state", "mountPath": STATE_DIR} in ctld["volumeMounts"]
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    assert spec["replicas"] == 1 and spec["serviceName"] == "slurmctld"
    assert ctld["readinessProbe"]["tcpSocket"]["port"] == 6817


def test_munge_key_is_generated_and_mounted_read_only(lab):
    secret = lab.one("kubernetes:core/v1:Secret", "munge-key")
    gen = next(r for r in lab.of_type("pulumi-python:dynamic:Resource") if r.name == "slurm-munge-bytes")
    assert gen.inputs["length"] == 1024
    assert set(secret.inputs["data"]) == {"munge.key"}
    for kind, name in (
        ("kubernetes:apps/v1:StatefulSet", "slurmctld"),
        ("kubernetes:apps/v1:Deployment", "slurm-login"),
        ("kubernetes:apps/v1:DaemonSet", "slurmd-h100"),
    ):
        spec = pod_spec(lab.one(kind, name))
        vol = next(v for v in spec["volumes"] if v["name"] == "munge-key")
        assert vol["secret"] == {"secretName": "munge-key", "defaultMode": 0o400}
        assert any(c["name"] == "munged" for c in spec["containers"])


def test_slurmd_runs_on_the_pools_nodes_with_all_their_gpus(lab):
    ds = lab.one("kubernetes:apps/v1:DaemonSet", "slurmd-h100")
    spec = pod_spec(ds)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "autoheal.io/pool", "operator": "In", "values": ["h100"]}]}
    ]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
        {"key": "autoheal.io/spare", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    ]
    slurmd = next(c for c in spec["containers"] if c["name"] == "slurmd")
    assert slurmd["resources"] == {
        "requests": {"nvidia.com/gpu": "8"},
        "limits": {"nvidia.com/gpu": "8"},
    }
    # Slurm node name == Kubernetes node name, the runbook's default identity.
    assert slurmd["command"][:4] == ["slurmd", "-D", "-N", "$(NODE_NAME)"]
    assert slurmd["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert slurmd["livenessProbe"]["tcpSocket"]["port"] == 6818
    # A config change must not restart slurmd under a running job.
    assert ds.inputs["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_shared_home_and_checkpoints_are_mounted_by_login_and_slurmd(lab):
    for claim in ("slurm-home", "slurm-checkpoints"):
        pvc = lab.one("kubernetes:core/v1:PersistentVolumeClaim", claim)
        assert pvc.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    for kind, name, container in (
        ("kubernetes:apps/v1:Deployment", "slurm-login", "sshd"),
        ("kubernetes:apps/v1:DaemonSet", "slurmd-h100", "slurmd"),
    ):
        spec = pod_spec(lab.one(kind, name))
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"]
            for v in spec["volumes"]
            if "persistentVolumeClaim" in v
        }
        c = next(c for c in spec["containers"] if c["name"] == container)
        mounted = {m["mountPath"]: claims.get(m["name"]) for m in c["volumeMounts"]}
        assert mounted["/home"] == "slurm-home"
        assert mounted["/checkpoints"] == "slurm-checkpoints"


def _one_pool_cluster(**slurm_args: Any) -> Recorded:
    def program():
        pool = GpuNodePool("p", GpuNodePoolArgs(name="a100", prefix="a", size=2, spares=1))
        SlurmCluster("s", SlurmClusterArgs(pools=[pool.placement], **slurm_args))

    return run_program(program)


def test_login_node_gets_the_authorized_keys_and_a_service():
    rec = _one_pool_cluster(
        authorized_keys=["ssh-ed25519 AAAA alice", "ssh-ed25519 BBBB bob "],
        login_service_type="LoadBalancer",
    )
    keys = rec.one("kubernetes:core/v1:ConfigMap", "slurm-login-keys")
    assert keys.inputs["data"]["authorized_keys"] == "ssh-ed25519 AAAA alice\nssh-ed25519 BBBB bob\n"
    svc = rec.one("kubernetes:core/v1:Service", "slurm-login")
    assert svc.inputs["spec"]["type"] == "LoadBalancer"
    assert svc.inputs["spec"]["ports"][0]["port"] == 22


def test_images_are_configurable():
    rec = _one_pool_cluster(images=SlurmImages(controller="reg/ctld:1", slurmd="reg/d:1"))
    ctld = pod_spec(rec.one("kubernetes:apps/v1:StatefulSet", "slurmctld"))["containers"][0]
    assert ctld["image"] == "reg/ctld:1"
    slurmd = pod_spec(rec.one("kubernetes:apps/v1:DaemonSet", "slurmd-a100"))["containers"][0]
    assert slurmd["image"] == "reg/d:1"


def test_each_pool_gets_its_own_slurmd_set_and_partition():
    def program():
        pools = [
            GpuNodePool("p1", GpuNodePoolArgs(name="h100", prefix="h", size=2, spares=1)),
            GpuNodePool(
                "p2",
                GpuNodePoolArgs(name="a100", prefix="a", size=1, spares=1, gpus_per_node=4, gpu_model="a100"),
            ),
        ]
        SlurmCluster("s", SlurmClusterArgs(pools=[p.placement for p in pools]))

    rec = run_program(program)
    names = sorted(str(r.k8s_name) for r in rec.of_type("kubernetes:apps/v1:DaemonSet"))
    assert names == ["slurmd-a100", "slurmd-h100"]
    a100 = pod_spec(rec.one("kubernetes:apps/v1:DaemonSet", "slurmd-a100"))["containers"][0]
    assert a100["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    conf = rec.one("kubernetes:core/v1:ConfigMap", "slurm-config").inputs["data"]["slurm.conf"]
    assert "PartitionName=a100 Nodes=a-[1-2] " in conf
    assert "NodeName=a-2 CPUs=2 RealMemory=1000 Gres=gpu:a100:4 Feature=pool_a100 State=DRAIN" in conf


def test_slurm_cluster_needs_a_pool():
    with pytest.raises(ValueError, match="at least one GPU pool"):
        run_program(lambda: SlurmCluster("s", SlurmClusterArgs(pools=[])))


def test_login_host_key_is_generated_once_and_mounted_for_sshd(lab):
    gen = [r for r in lab.of_type("pulumi-python:dynamic:Resource") if r.name == "slurm-login-hostkey"]
    assert len(gen) == 1 and gen[0].inputs["comment"] == "autoheal-login"
    secret = lab.one("kubernetes:core/v1:Secret", "slurm-login-hostkey")
    assert set(secret.inputs["stringData"]) == {"ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"}
    assert "PRIVATE KEY" in secret.inputs["stringData"]["ssh_host_ed25519_key"]
    spec = pod_spec(lab.one("kubernetes:apps/v1:Deployment", "slurm-login"))
    vol = next(v for v in spec["volumes"] if v["name"] == "host-key")
    assert vol["secret"] == {"secretName": "slurm-login-hostkey", "defaultMode": 0o400}
    sshd = next(c for c in spec["containers"] if c["name"] == "sshd")
    key_path = sshd["command"][sshd["command"].index("-h") + 1]
    mount = next(m for m in sshd["volumeMounts"] if m["name"] == "host-key")
    assert key_path == f"{mount['mountPath']}/ssh_host_ed25519_key"
