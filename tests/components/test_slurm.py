"""SlurmCluster: configuration generated from the pools, persistent controller state, login with
SSH keys, shared storage, and one slurmd DaemonSet per pool placed on that pool's nodes."""

from __future__ import annotations

from typing import Any

import pytest

from components.common import Taint
from components.nodepool import GpuNodePool, GpuNodePoolArgs
from components.slurm import STATE_DIR, ClusterUser, SlurmCluster, SlurmClusterArgs, SlurmImages
from tests.components.harness import Recorded, pod_spec, run_program


def _conf(lab: Recorded, key: str) -> str:
    return str(lab.one("kubernetes:core/v1:ConfigMap", "slurm-config").inputs["data"][key])


def test_slurm_conf_declares_no_node_but_room_and_a_node_set_per_pool(lab):
    conf = _conf(lab, "slurm.conf")
    # dynamic nodes: each slurmd registers itself under its Kubernetes node's name
    assert not [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert "MaxNodeCount=12" in conf.splitlines()  # size 4 + spares 2 + headroom 6
    assert "NodeSet=ns_h100 Feature=pool_h100" in conf
    assert "PartitionName=h100 Nodes=ns_h100 MaxTime=INFINITE State=UP" in conf
    assert "PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in conf


def test_controller_address_and_state_location(lab):
    conf = _conf(lab, "slurm.conf")
    assert "SlurmctldHost=slurmctld-0(slurmctld-0.slurmctld.slurm.svc.cluster.local)" in conf
    assert f"StateSaveLocation={STATE_DIR}" in conf
    assert "SlurmUser=slurm" in conf


def test_each_pool_has_its_gres_conf_mounted_as_gres_conf_for_its_slurmd(lab):
    assert _conf(lab, "gres-h100.conf").splitlines()[1:] == [
        "AutoDetect=off",
        "Name=gpu Type=h100 File=/dev/nvidia[0-7]",
    ]
    assert "NodeName" not in _conf(lab, "gres.conf")  # the controller's and login's: no devices
    spec = pod_spec(lab.one("kubernetes:apps/v1:DaemonSet", "slurmd-h100"))
    vol = next(v for v in spec["volumes"] if v["name"] == "slurm-config")
    assert vol["configMap"]["items"] == [
        {"key": "slurm.conf", "path": "slurm.conf"},
        {"key": "cgroup.conf", "path": "cgroup.conf"},
        {"key": "gres-h100.conf", "path": "gres.conf"},
    ]


def test_jobs_are_confined_to_their_gpus_by_cgroups_in_a_privileged_slurmd(lab):
    conf = _conf(lab, "slurm.conf").splitlines()
    assert "TaskPlugin=task/cgroup" in conf and "ProctrackType=proctrack/cgroup" in conf
    cgroup = _conf(lab, "cgroup.conf").splitlines()
    assert "ConstrainDevices=yes" in cgroup and "CgroupPlugin=autodetect" in cgroup
    spec = pod_spec(lab.one("kubernetes:apps/v1:DaemonSet", "slurmd-h100"))
    slurmd = next(c for c in spec["containers"] if c["name"] == "slurmd")
    assert slurmd["securityContext"] == {"privileged": True}  # a read-write cgroup mount
    # nothing else of the cluster runs privileged
    for kind, name in (
        ("kubernetes:apps/v1:StatefulSet", "slurmctld"),
        ("kubernetes:apps/v1:Deployment", "slurm-login"),
    ):
        for c in pod_spec(lab.one(kind, name))["containers"]:
            assert not (c.get("securityContext") or {}).get("privileged"), (name, c["name"])


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
    assert "scontrol ping" in ctld["readinessProbe"]["exec"]["command"][-1]
    # slurmctld drops to SlurmUser: an init container gives it the (root-owned) fresh volume
    owner = next(c for c in spec["template"]["spec"]["initContainers"] if c["name"] == "state-owner")
    assert f"install -d -o slurm -g slurm -m 0755 {STATE_DIR}" in owner["command"][-1]


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
        inits = {c["name"]: c for c in spec["initContainers"]}
        # munged refuses the Secret's symlink: a copy owned by munge, 0400, in a 0700 directory
        copy = inits["munge-key"]["command"][-1]
        assert "install -d -o munge -g munge -m 0700 /etc/munge" in copy
        assert "install -o munge -g munge -m 0400 /etc/munge-secret/munge.key /etc/munge/munge.key" in copy
        # munged is a native sidecar: up before the daemon, down after it
        munged = inits["munged"]
        assert munged["restartPolicy"] == "Always"
        assert munged["command"][:4] == ["runuser", "-u", "munge", "--"]
        assert list(inits) == ["munge-key", *(["state-owner"] if name == "slurmctld" else []), "munged"]


def test_slurmd_runs_on_the_pools_nodes_with_all_their_gpus(lab):
    ds = lab.one("kubernetes:apps/v1:DaemonSet", "slurmd-h100")
    spec = pod_spec(ds)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # off the node while the recovery ladder resets or validates its GPUs (holders.yml)
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "autoheal.io/pool", "operator": "In", "values": ["h100"]},
                {"key": "autoheal.io/gpu-agents", "operator": "NotIn", "values": ["stopped"]},
                # off a node lent to inference (remediation/lender.py)
                {"key": "autoheal.io/lend", "operator": "NotIn", "values": ["lent", "returning"]},
            ]
        }
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
    # a dynamic node named after the Kubernetes node, declaring the pool's resources and feature
    script = slurmd["command"][-1]
    assert 'slurmd -D -Z -N "$NODE_NAME" --conf "$NODE_CONF"' in script
    assert 'scontrol delete nodename="$NODE_NAME"' in script  # a stopped pod's node leaves Slurm
    env = {e["name"]: e for e in slurmd["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NODE_CONF"]["value"] == "CPUs=2 RealMemory=1000 Gres=gpu:h100:8 Feature=pool_h100"
    assert 'scontrol show node "$NODE_NAME"' in slurmd["readinessProbe"]["exec"]["command"][-1]
    # restarted only when Slurm says it has no record of the node (never for an unreachable slurmctld)
    alive = slurmd["livenessProbe"]
    assert (
        alive["exec"]["command"][-1]
        == '! scontrol show node "$NODE_NAME" 2>&1 | grep -qE "not found|Invalid node name"'
    )
    assert alive["periodSeconds"] * alive["failureThreshold"] >= 60
    assert not spec.get("hostNetwork")  # the pod network, as Slinky: a hostname per slurmd
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
    assert "PartitionName=a100 Nodes=ns_a100 MaxTime=INFINITE State=UP" in conf
    assert {"name": "NODE_CONF", "value": "CPUs=2 RealMemory=1000 Gres=gpu:a100:4 Feature=pool_a100"} in a100[
        "env"
    ]


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
    argv = sshd["command"][-1].splitlines()[-1].split()
    key_path = argv[argv.index("-h") + 1]
    mount = next(m for m in sshd["volumeMounts"] if m["name"] == "host-key")
    assert key_path == f"{mount['mountPath']}/ssh_host_ed25519_key"


def test_login_takes_keys_only_for_the_cluster_user_and_slurm_pods_know_that_user():
    rec = _one_pool_cluster(user=ClusterUser("ada", 2001, 2001))
    sshd = pod_spec(rec.one("kubernetes:apps/v1:Deployment", "slurm-login"))["containers"][0]
    script = sshd["command"][-1]
    for option in ("-oUsePAM=no", "-oPasswordAuthentication=no", "-oPermitRootLogin=no"):
        assert option in script
    assert "-oAuthorizedKeysFile=/etc/ssh/autoheal/authorized_keys" in script
    for kind, name in (
        ("kubernetes:apps/v1:StatefulSet", "slurmctld"),
        ("kubernetes:apps/v1:Deployment", "slurm-login"),
        ("kubernetes:apps/v1:DaemonSet", "slurmd-a100"),
    ):
        main = pod_spec(rec.one(kind, name))["containers"][0]["command"][-1]
        # the same uid everywhere: slurmctld resolves the submitter, slurmd runs the job as it
        assert "useradd -u 2001 -g 2001 -M -d /home/ada -s /bin/bash -p '*' ada" in main


def test_controller_and_login_tolerate_only_the_declared_taints():
    plain = _one_pool_cluster()
    assert not pod_spec(plain.one("kubernetes:apps/v1:StatefulSet", "slurmctld")).get("tolerations")
    rec = _one_pool_cluster(tolerate=[Taint("nvidia.com/gpu", value="present")])
    want = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}]
    assert pod_spec(rec.one("kubernetes:apps/v1:StatefulSet", "slurmctld"))["tolerations"] == want
    assert pod_spec(rec.one("kubernetes:apps/v1:Deployment", "slurm-login"))["tolerations"] == want


def test_slurmd_reads_its_node_and_a_spare_registers_drained_with_autoheals_reason(lab):
    """A node carrying the spare taint joins Slurm DRAINED (State=DRAIN in slurmd's --conf, no
    window in which a job could land); slurmd's own ServiceAccount may get nodes, nothing else."""
    from autoheal.labels import SPARE_REASON, SPARE_TAINT_KEY

    spec = pod_spec(lab.one("kubernetes:apps/v1:DaemonSet", "slurmd-h100"))
    assert spec["serviceAccountName"] == "slurmd"
    script = spec["containers"][0]["command"][-1]
    assert "/api/v1/nodes/$NODE_NAME" in script and f'select(.key == "{SPARE_TAINT_KEY}")' in script
    assert f'[ "$SPARE" = 0 ] || NODE_CONF="$NODE_CONF State=DRAIN Reason=\\"{SPARE_REASON}\\""' in script
    # the spare check runs before slurmd starts, under `sh -e`: an unreadable node stops the pod
    assert script.index("SPARE=$(") < script.index("slurmd -D -Z")
    assert spec["containers"][0]["command"][:2] == ["sh", "-ec"]
    role = lab.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRole", "autoheal-slurmd")
    assert role.inputs["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    binding = lab.one("kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding", "autoheal-slurmd")
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "slurmd", "namespace": "slurm"}]
    # Ready only once slurmctld hears from this slurmd (a record kept across a reboot is not enough)
    probe = spec["containers"][0]["readinessProbe"]["exec"]["command"][-1]
    assert "NOT_RESPONDING" in probe


def test_software_trees_are_mounted_read_only_in_login_and_slurmd():
    from components.slurm import SoftwareVolume

    rec = _one_pool_cluster(
        software=[
            SoftwareVolume(name="sw", mount_path="/opt/sw", claim="apps-nfs"),
            SoftwareVolume(name="py", mount_path="/opt/py", host_path="/srv/python"),
        ]
    )
    for kind, name in (
        ("kubernetes:apps/v1:Deployment", "slurm-login"),
        ("kubernetes:apps/v1:DaemonSet", "slurmd-a100"),
    ):
        spec = pod_spec(rec.one(kind, name))
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["sw"]["persistentVolumeClaim"] == {"claimName": "apps-nfs", "readOnly": True}
        assert volumes["py"]["hostPath"] == {"path": "/srv/python", "type": "Directory"}
        mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
        assert mounts["/opt/sw"]["readOnly"] is True and mounts["/opt/py"]["readOnly"] is True
    with pytest.raises(ValueError, match="exactly one of claim and host_path"):
        _one_pool_cluster(software=[SoftwareVolume(name="x", mount_path="/x")])
