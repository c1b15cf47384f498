"""Storage on EKS: the EBS and EFS CSI drivers (managed add-ons, each with its IRSA role), an EFS
file system reachable from every node, and the StorageClasses the stack's claims name.

Without them every claim stays Pending: an EKS cluster of 1.30 or later has no default
StorageClass and no CSI driver. The classes are made only when the stack's storage keys name them
(`slurm.storage.stateStorageClass`, `sharedStorageClass`, `runner.journalStorageClass`): a class
the stack does not use is the cluster operator's business, not the stack's.

* EBS (`ebsClass`, default `gp3`): encrypted gp3 volumes, bound where the pod lands
  (WaitForFirstConsumer: a volume lives in one zone, so it is made in the zone of the node the
  scheduler picked) — slurmctld's state and the runner's journal.
* FSx for Lustre (`fsxClass`, default `fsx-lustre`), for checkpoints that many nodes write at
  once (`slurm.storage.checkpointStorageClass`): a file system per claim, made by the FSx CSI
  driver in the cluster's first subnet (a Lustre file system lives in one zone), behind a security
  group admitting Lustre (988, 1018-1023) from the nodes and from itself. The driver rounds a
  claim up to the deployment type's size steps (PERSISTENT_2 at 250 MB/s/TiB: 2.4 TiB).
* EFS (`efsClass`, default `efs-sc`): one encrypted file system with a mount target in every
  subnet of the cluster, reachable over NFS from the cluster security group (every node carries
  it); each claim is an access point (`efs-ap`) — the shared home and checkpoints, mounted on
  every slurmd and login pod (ReadWriteMany).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pulumi
import pulumi_kubernetes as k8s

from components import k8sargs
from components.common import base_labels
from components.eks import addons
from components.eks.iam import Oidc, irsa_role

EBS_PROVISIONER: Final = "ebs.csi.aws.com"
EFS_PROVISIONER: Final = "efs.csi.aws.com"
EBS_CSI_POLICY: Final = "arn:aws:iam::aws:policy/service-role/AmazonEBSCSIDriverPolicy"
EFS_CSI_POLICY: Final = "arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"
# the ServiceAccounts the add-ons' controllers run as (their IRSA roles trust exactly these)
EBS_CSI_SERVICE_ACCOUNT: Final = "ebs-csi-controller-sa"
EFS_CSI_SERVICE_ACCOUNT: Final = "efs-csi-controller-sa"
FSX_PROVISIONER: Final = "fsx.csi.aws.com"
FSX_CSI_POLICY: Final = "arn:aws:iam::aws:policy/AmazonFSxFullAccess"  # AWS's advice for the add-on
FSX_CSI_SERVICE_ACCOUNT: Final = "fsx-csi-controller-sa"
NFS_PORT: Final = 2049
LUSTRE_PORTS: Final = ((988, 988), (1018, 1023))
STORAGE_LABELS: Final = base_labels("autoheal-storage", "storage")


@dataclass(frozen=True)
class FsxArgs:
    class_name: str
    deployment_type: str = "PERSISTENT_2"
    throughput: int = 250  # MB/s per TiB (PERSISTENT deployment types)


@dataclass(frozen=True)
class AwsContext:
    """What AWS resources of an EKS stack share: the cluster, its provider, tags and the issuer."""

    cluster_name: pulumi.Input[str]
    oidc: Oidc
    tags: Mapping[str, str]
    opts: pulumi.ResourceOptions  # parent and the AWS provider
    depends_on: Sequence[pulumi.Resource]  # what an add-on's controller needs: nodes to run on


def csi_driver(name: str, ctx: AwsContext, addon_name: str, service_account: str, policy: str) -> Any:
    """A CSI driver add-on whose controller's ServiceAccount assumes its own role (IRSA)."""
    role = irsa_role(f"{name}-role", ctx.oidc, "kube-system", service_account, [policy], ctx.tags, ctx.opts)
    return addons.addon(
        name,
        ctx.cluster_name,
        addon_name,
        ctx.tags,
        ctx.opts,
        role_arn=role.role.arn,
        depends_on=[*ctx.depends_on, *role.attachments],
    )


def ebs_storage_class(
    name: str, class_name: str, opts: pulumi.ResourceOptions
) -> k8s.storage.v1.StorageClass:
    return k8s.storage.v1.StorageClass(
        name,
        metadata=k8sargs.meta(class_name, None, STORAGE_LABELS),
        provisioner=EBS_PROVISIONER,
        parameters={"type": "gp3", "encrypted": "true", "csi.storage.k8s.io/fstype": "ext4"},
        volume_binding_mode="WaitForFirstConsumer",
        allow_volume_expansion=True,
        opts=opts,
    )


def efs_file_system(
    name: str,
    subnet_ids: Sequence[str],
    vpc_id: pulumi.Input[str],
    node_security_group: pulumi.Input[str],
    ctx: AwsContext,
) -> tuple[Any, list[Any]]:
    """An encrypted EFS file system with a mount target per subnet, admitting NFS from the
    cluster security group; returns it and its mount targets (a claim mounts once they exist)."""
    import pulumi_aws as aws

    sg = aws.ec2.SecurityGroup(
        f"{name}-sg",
        description="NFS to the autoheal EFS file system from the EKS cluster's nodes",
        vpc_id=vpc_id,
        ingress=[
            aws.ec2.SecurityGroupIngressArgs(
                protocol="tcp", from_port=NFS_PORT, to_port=NFS_PORT, security_groups=[node_security_group]
            )
        ],
        tags=dict(ctx.tags),
        opts=ctx.opts,
    )
    fs = aws.efs.FileSystem(
        name,
        encrypted=True,
        performance_mode="generalPurpose",
        throughput_mode="elastic",
        tags={**ctx.tags, "Name": name},
        opts=ctx.opts,
    )
    targets = [
        aws.efs.MountTarget(
            f"{name}-mount-{i}",
            file_system_id=fs.id,
            subnet_id=subnet,
            security_groups=[sg.id],
            opts=ctx.opts,
        )
        for i, subnet in enumerate(subnet_ids)
    ]
    return fs, targets


def efs_storage_class(
    name: str, class_name: str, file_system_id: pulumi.Input[str], opts: pulumi.ResourceOptions
) -> k8s.storage.v1.StorageClass:
    """Each claim an access point of the file system, its root owned by the access point's uid."""
    return k8s.storage.v1.StorageClass(
        name,
        metadata=k8sargs.meta(class_name, None, STORAGE_LABELS),
        provisioner=EFS_PROVISIONER,
        parameters={"provisioningMode": "efs-ap", "fileSystemId": file_system_id, "directoryPerms": "700"},
        volume_binding_mode="Immediate",
        opts=opts,
    )


def lustre_security_group(
    name: str, vpc_id: pulumi.Input[str], node_security_group: pulumi.Input[str], ctx: AwsContext
) -> Any:
    """Lustre's ports from the nodes (the cluster security group) and between the file servers."""
    import pulumi_aws as aws

    ingress = [
        aws.ec2.SecurityGroupIngressArgs(
            protocol="tcp", from_port=low, to_port=high, security_groups=[node_security_group], self=True
        )
        for low, high in LUSTRE_PORTS
    ]
    return aws.ec2.SecurityGroup(
        name,
        description="Lustre to the autoheal FSx file systems from the EKS cluster's nodes",
        vpc_id=vpc_id,
        ingress=ingress,
        egress=[
            aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"])
        ],
        tags=dict(ctx.tags),
        opts=ctx.opts,
    )


def fsx_storage_class(
    name: str,
    fsx: FsxArgs,
    subnet_id: str,
    security_group_id: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> k8s.storage.v1.StorageClass:
    """A Lustre file system per claim, LZ4-compressed (checkpoints compress well)."""
    parameters: dict[str, pulumi.Input[str]] = {
        "subnetId": subnet_id,
        "securityGroupIds": security_group_id,
        "deploymentType": fsx.deployment_type,
        "dataCompressionType": "LZ4",
    }
    if fsx.deployment_type.startswith("PERSISTENT"):
        parameters["perUnitStorageThroughput"] = str(fsx.throughput)
    return k8s.storage.v1.StorageClass(
        name,
        metadata=k8sargs.meta(fsx.class_name, None, STORAGE_LABELS),
        provisioner=FSX_PROVISIONER,
        parameters=parameters,
        mount_options=["flock"],  # jobs lock checkpoint files
        volume_binding_mode="Immediate",
        opts=opts,
    )
