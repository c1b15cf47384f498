"""EksPlatform: what an EKS cluster needs before autoheal's workloads can run on it, beyond the
control plane and node groups that KubernetesCluster and GpuNodePool declare.

* a device plugin on the GPU pools' nodes (components.device_plugins), and AWS's EFA device plugin
  on the pools whose instances have EFA interfaces;
* the EBS CSI driver, and the StorageClasses (with the EFS CSI driver and an EFS file system for
  a shared class) the stack's claims name (components.eks.storage);
* the runner's IAM role (IRSA): it may describe instances, and reboot or terminate, or mark
  unhealthy in their autoscaling group, only the instances of this stack's own GPU node groups.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import pulumi

from components.cluster import EksCluster
from components.common import child
from components.device_plugins import (
    EFA_DEVICE_PLUGIN_IMAGE,
    GPU_OPERATOR_VERSION,
    NVIDIA_DEVICE_PLUGIN_IMAGE,
    DevicePluginPlacement,
    efa_device_plugin,
    gpu_operator,
    nvidia_device_plugin,
)
from components.eks import addons, storage
from components.eks.iam import irsa_role
from components.nodepool import PoolPlacement

DevicePlugin = Literal["nvidia", "gpu-operator", "none"]
ROLE_ARN_ANNOTATION: Final = "eks.amazonaws.com/role-arn"  # IRSA: the role a ServiceAccount assumes
# the tags EKS puts on a managed node group's instances and autoscaling group
NODEGROUP_TAG: Final = "eks:nodegroup-name"
CLUSTER_TAG: Final = "eks:cluster-name"
# what replacing a node needs that is not a Kubernetes verb
RUNNER_DESCRIBE_ACTIONS: Final = (
    "ec2:DescribeInstances",
    "ec2:DescribeInstanceStatus",
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
)
RUNNER_EC2_ACTIONS: Final = ("ec2:RebootInstances", "ec2:TerminateInstances")
RUNNER_ASG_ACTIONS: Final = (
    "autoscaling:SetInstanceHealth",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
)


@dataclass(frozen=True)
class EksPlatformArgs:
    cluster: EksCluster
    pools: Sequence[PoolPlacement]
    # the pools' managed node group names (the runner may act on their instances only)
    node_groups: Sequence[str]
    efa_pools: Sequence[str] = ()  # pools whose instances have EFA interfaces
    device_plugin: DevicePlugin = "nvidia"
    device_plugin_image: str = NVIDIA_DEVICE_PLUGIN_IMAGE
    gpu_operator_version: str = GPU_OPERATOR_VERSION
    # the GPU Operator's dcgm-exporter: where the stack runs none of its own (GpuMonitoring)
    operator_dcgm_exporter: bool = False
    efa_device_plugin_image: str = EFA_DEVICE_PLUGIN_IMAGE
    ebs_class: str | None = None  # a StorageClass name the stack's claims use; None: not made
    efs_class: str | None = None
    fsx: storage.FsxArgs | None = None  # FSx for Lustre, when a claim names its class
    runner_namespace: pulumi.Input[str] = "autoheal"
    runner_service_account: str = "autoheal-runner"
    tags: dict[str, str] = field(default_factory=dict)


class EksPlatform(pulumi.ComponentResource):
    """Device plugins, storage and the runner's IAM role on EKS; see the module docstring."""

    runner_role_arn: pulumi.Output[str]

    def __init__(self, name: str, args: EksPlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("autoheal:eks:EksPlatform", name, None, opts)
        self._name, self._args = name, args
        self._device_plugins()
        self._storage()
        self.runner_role_arn = self._runner_role()
        self.register_outputs({"runnerRoleArn": self.runner_role_arn})

    def _placement(self, pools: Sequence[PoolPlacement]) -> DevicePluginPlacement:
        return DevicePluginPlacement(
            pools=[p.pool.name for p in pools], taints=[t for p in pools for t in p.taints]
        )

    def _device_plugins(self) -> None:
        a, name = self._args, self._name
        gpus = self._placement(a.pools)
        if a.device_plugin == "nvidia":
            nvidia_device_plugin(self, name, gpus, a.device_plugin_image)
        elif a.device_plugin == "gpu-operator":
            gpu_operator(self, name, gpus, a.gpu_operator_version, a.operator_dcgm_exporter)
        efa = [p for p in a.pools if p.pool.name in a.efa_pools]
        if efa:
            efa_device_plugin(self, name, self._placement(efa), a.efa_device_plugin_image)

    def _aws(self) -> storage.AwsContext:
        c = self._args.cluster
        if c.oidc is None:
            raise ValueError(f"EksPlatform {self._name}: the cluster has no OIDC provider")
        system = [c.system_node_group] if c.system_node_group is not None else []
        return storage.AwsContext(
            c.cluster_name, c.oidc, c.tags, child(self, provider=c.aws_provider), depends_on=system
        )

    def _storage(self) -> None:
        a, name, ctx = self._args, self._name, self._aws()
        # always: any EBS volume a claim asks for, whatever its class, needs the driver
        ebs_driver = storage.csi_driver(
            f"{name}-addon-{addons.EBS_CSI_ADDON}",
            ctx,
            addons.EBS_CSI_ADDON,
            storage.EBS_CSI_SERVICE_ACCOUNT,
            storage.EBS_CSI_POLICY,
        )
        if a.ebs_class is not None:
            storage.ebs_storage_class(
                f"{name}-{a.ebs_class}", a.ebs_class, child(self, depends_on=[ebs_driver])
            )
        if a.efs_class is not None:
            self._efs(a.efs_class, ctx)
        if a.fsx is not None:
            self._fsx(a.fsx, ctx)

    def _efs(self, class_name: str, ctx: storage.AwsContext) -> None:
        c, name = self._args.cluster, self._name
        if c.vpc_id is None or c.security_group_id is None:
            raise ValueError(f"EksPlatform {name}: the cluster's VPC and security group are unknown")
        fs, targets = storage.efs_file_system(f"{name}-efs", c.subnet_ids, c.vpc_id, c.security_group_id, ctx)
        driver = storage.csi_driver(
            f"{name}-addon-{addons.EFS_CSI_ADDON}",
            ctx,
            addons.EFS_CSI_ADDON,
            storage.EFS_CSI_SERVICE_ACCOUNT,
            storage.EFS_CSI_POLICY,
        )
        storage.efs_storage_class(
            f"{name}-{class_name}", class_name, fs.id, child(self, depends_on=[driver, *targets])
        )

    def _fsx(self, fsx: storage.FsxArgs, ctx: storage.AwsContext) -> None:
        c, name = self._args.cluster, self._name
        if c.vpc_id is None or c.security_group_id is None:
            raise ValueError(f"EksPlatform {name}: the cluster's VPC and security group are unknown")
        sg = storage.lustre_security_group(f"{name}-fsx-sg", c.vpc_id, c.security_group_id, ctx)
        driver = storage.csi_driver(
            f"{name}-addon-{addons.FSX_CSI_ADDON}",
            ctx,
            addons.FSX_CSI_ADDON,
            storage.FSX_CSI_SERVICE_ACCOUNT,
            storage.FSX_CSI_POLICY,
        )
        storage.fsx_storage_class(
            f"{name}-{fsx.class_name}", fsx, c.subnet_ids[0], sg.id, child(self, depends_on=[driver])
        )

    def _runner_role(self) -> pulumi.Output[str]:
        a, ctx = self._args, self._aws()
        role = irsa_role(
            f"{self._name}-runner-role",
            ctx.oidc,
            a.runner_namespace,
            a.runner_service_account,
            [],
            ctx.tags,
            ctx.opts,
        )
        import pulumi_aws as aws

        aws.iam.RolePolicy(
            f"{self._name}-runner-policy",
            role=role.role.id,
            policy=pulumi.Output.from_input(a.cluster.cluster_name).apply(
                lambda cluster: runner_policy(cluster, a.node_groups)
            ),
            opts=ctx.opts,
        )
        arn: pulumi.Output[str] = role.role.arn
        return arn


def runner_policy(cluster_name: str, node_groups: Sequence[str]) -> str:
    """Describe anything; act only on instances (and their autoscaling groups) that EKS tagged as
    this cluster's and one of the stack's GPU node groups': never the system nodes, never another
    cluster's."""
    own = {
        "StringEquals": {
            f"aws:ResourceTag/{CLUSTER_TAG}": cluster_name,
            f"aws:ResourceTag/{NODEGROUP_TAG}": sorted(node_groups),
        }
    }
    statements = [
        {"Sid": "Describe", "Effect": "Allow", "Action": list(RUNNER_DESCRIBE_ACTIONS), "Resource": "*"},
        {
            "Sid": "RebootOrTerminateOwnGpuNodes",
            "Effect": "Allow",
            "Action": list(RUNNER_EC2_ACTIONS),
            "Resource": "arn:aws:ec2:*:*:instance/*",
            "Condition": own,
        },
        {
            "Sid": "ReplaceOwnGpuNodesInTheirGroup",
            "Effect": "Allow",
            "Action": list(RUNNER_ASG_ACTIONS),
            "Resource": "*",
            "Condition": own,
        },
    ]
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, sort_keys=True)
