"""Device plugins: what makes a GPU pool's node advertise `nvidia.com/gpu` (and EFA interfaces).

Without a device plugin no node has the extended resource, so every slurmd pod (which requests
all of its node's GPUs) stays Pending. On EKS the stack declares one, chosen by
`cluster.eks.devicePlugin`:

* ``nvidia``: NVIDIA's k8s-device-plugin as a plain DaemonSet in kube-system, by digest;
* ``gpu-operator``: NVIDIA's GPU Operator chart (a Helm release, pinned to a chart version), which
  brings its own device plugin, and its own dcgm-exporter only where the stack runs none
  (`monitoring.dcgmExporter: false`): one exporter per GPU, not two;
* ``none``: the cluster already runs one (the preflight checks a node advertises the resource).

The DaemonSets run on the pools' nodes only (the pool label), tolerating the pools' taints, the
hot-spare taint (a spare must advertise its GPUs before a promotion puts work on it) and the
runbook's quarantine taint (a fenced node keeps its plugin while it drains). They are
`system-node-critical`: a node without its plugin loses its GPUs to the scheduler. Each carries
`autoheal.labels.ADVERTISES_ANNOTATION` naming the resource its pods advertise, which the
schedulability proof (lab.schedulable) reads to decide which nodes get that resource.

Pool instance types with EFA (components/instances.py) get AWS's EFA device plugin, advertising
`vpc.amazonaws.com/efa` on those pools' nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from components import k8sargs
from components.common import SPARE_TAINT, Taint, base_labels, child
from components.instances import EFA_RESOURCE

# NVIDIA's k8s-device-plugin v0.17.0, by the digest a node reported pulling that tag
# (`kubectl get pod -o jsonpath='{..imageID}'`). Re-check, or pin another tag, with
# `skopeo inspect docker://nvcr.io/nvidia/k8s-device-plugin:v0.17.0 | jq -r .Digest`.
NVIDIA_DEVICE_PLUGIN_IMAGE: Final = (
    "nvcr.io/nvidia/k8s-device-plugin@sha256:7089559ce6153018806857f5049085bae15b3bf6f1c8bd19d8b12f707d087dea"
)
# AWS's EFA device plugin v0.3.3 from the EKS ECR account of us-east-1, by a digest seen on nodes;
# other regions serve the same image from their own ECR endpoint. Re-check with `skopeo inspect
# docker://602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/aws-efa-k8s-device-plugin:v0.3.3`
# (ECR needs `--creds AWS:$(aws ecr get-login-password)`).
EFA_DEVICE_PLUGIN_IMAGE: Final = (
    "602401143452.dkr.ecr.us-east-1.amazonaws.com/eks/aws-efa-k8s-device-plugin"
    "@sha256:364d46e3e482f7cd03c586a69996348aa0ec8e6ff711d73013fbfba1ceb0b20d"
)
# NVIDIA's gpu-operator Helm chart (https://helm.ngc.nvidia.com/nvidia), pinned: a chart version
# fixes the images it deploys.
GPU_OPERATOR_VERSION: Final = "v24.9.2"
GPU_OPERATOR_REPO: Final = "https://helm.ngc.nvidia.com/nvidia"
DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"  # the kubelet's plugin socket dir
SYSTEM_NAMESPACE: Final = "kube-system"
# the runbook's fence: a quarantined node keeps its plugin while it drains
QUARANTINE_TOLERATION: Final = Taint(key=lb.QUARANTINE_TAINT_KEY)


@dataclass(frozen=True)
class DevicePluginPlacement:
    """The nodes a device plugin runs on: those of `pools` (their pool label), and the taints
    they may carry."""

    pools: Sequence[str]
    taints: Sequence[Taint]

    def tolerations(self) -> list[k8s.core.v1.TolerationArgs]:
        seen: dict[tuple[str, str | None, str], Taint] = {}
        for t in (*self.taints, SPARE_TAINT, QUARANTINE_TOLERATION):
            seen.setdefault((t.key, t.value, t.effect), t)
        return [t.toleration() for t in seen.values()]

    def affinity(self) -> k8s.core.v1.AffinityArgs:
        return k8sargs.required_node_affinity([k8sargs.node_has(lb.POOL_LABEL, *sorted(self.pools))])


def nvidia_device_plugin(
    parent: pulumi.Resource, name: str, placement: DevicePluginPlacement, image: str
) -> k8s.apps.v1.DaemonSet:
    """NVIDIA's device plugin on the GPU pools' nodes: advertises nvidia.com/gpu."""
    container = k8s.core.v1.ContainerArgs(
        name="nvidia-device-plugin",
        image=image,
        env=[k8sargs.env("FAIL_ON_INIT_ERROR", "false")],  # a node whose driver is not up yet retries
        security_context=k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
        volume_mounts=[k8sargs.mount("device-plugin", DEVICE_PLUGIN_DIR)],
    )
    return _plugin_daemon_set(
        parent, f"{name}-nvidia-device-plugin", "nvidia-device-plugin", lb.GPU_RESOURCE, placement, container
    )


def efa_device_plugin(
    parent: pulumi.Resource, name: str, placement: DevicePluginPlacement, image: str
) -> k8s.apps.v1.DaemonSet:
    """AWS's EFA device plugin on the EFA pools' nodes: advertises vpc.amazonaws.com/efa."""
    container = k8s.core.v1.ContainerArgs(
        name="aws-efa-k8s-device-plugin",
        image=image,
        security_context=k8s.core.v1.SecurityContextArgs(
            allow_privilege_escalation=False,
            capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        ),
        volume_mounts=[k8sargs.mount("device-plugin", DEVICE_PLUGIN_DIR)],
    )
    return _plugin_daemon_set(
        parent, f"{name}-efa-device-plugin", "aws-efa-k8s-device-plugin", EFA_RESOURCE, placement, container
    )


def _plugin_daemon_set(
    parent: pulumi.Resource,
    resource_name: str,
    obj: str,
    advertises: str,
    placement: DevicePluginPlacement,
    container: k8s.core.v1.ContainerArgs,
) -> k8s.apps.v1.DaemonSet:
    labels = base_labels(obj, "device-plugin")
    pod = k8s.core.v1.PodSpecArgs(
        priority_class_name="system-node-critical",
        affinity=placement.affinity(),
        tolerations=placement.tolerations(),
        containers=[container],
        volumes=[
            k8s.core.v1.VolumeArgs(
                name="device-plugin",
                host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=DEVICE_PLUGIN_DIR, type="Directory"),
            )
        ],
    )
    return k8s.apps.v1.DaemonSet(
        resource_name,
        metadata=k8sargs.meta(obj, SYSTEM_NAMESPACE, labels, {lb.ADVERTISES_ANNOTATION: advertises}),
        spec=k8s.apps.v1.DaemonSetSpecArgs(
            selector=k8sargs.selector(labels),
            update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="RollingUpdate"),
            template=k8sargs.template(labels, pod),
        ),
        opts=child(parent),
    )


def gpu_operator(
    parent: pulumi.Resource, name: str, placement: DevicePluginPlacement, version: str, dcgm_exporter: bool
) -> k8s.helm.v3.Release:
    """NVIDIA's GPU Operator, pinned to a chart version; its operands run on the pools' nodes.
    The EKS GPU AMIs ship the driver and container toolkit, so the operator installs neither;
    its dcgm-exporter runs when `dcgm_exporter` (the stack runs none of its own)."""
    tolerations = [t.as_dict() for t in (*placement.taints, SPARE_TAINT, QUARANTINE_TOLERATION)]
    for t in tolerations:
        t["operator"] = "Equal" if "value" in t else "Exists"
    return k8s.helm.v3.Release(
        f"{name}-gpu-operator",
        name="gpu-operator",
        chart="gpu-operator",
        version=version,
        namespace="gpu-operator",
        create_namespace=True,
        repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=GPU_OPERATOR_REPO),
        values={
            "driver": {"enabled": False},
            "toolkit": {"enabled": False},
            "dcgmExporter": {"enabled": dcgm_exporter},
            "daemonsets": {"tolerations": tolerations},
            "node-feature-discovery": {"worker": {"tolerations": tolerations}},
        },
        opts=child(parent),
    )
