"""EKS managed add-ons: the cluster's networking and DNS, and the CSI drivers.

A cluster made from `aws.eks.Cluster` alone has none of them installed by Pulumi: vpc-cni and
kube-proxy let nodes become Ready, CoreDNS lets pods resolve Services (it needs a node it may run
on: the system node group, so it is declared after it). No version is pinned: EKS installs the
default version for the cluster's Kubernetes version, and an upgrade of the control plane is the
moment to move them (`aws eks describe-addon-versions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi

# Networking first (nodes need it to become Ready), DNS once a system node exists.
NETWORK_ADDONS = ("vpc-cni", "kube-proxy")
DNS_ADDON = "coredns"
EBS_CSI_ADDON = "aws-ebs-csi-driver"
EFS_CSI_ADDON = "aws-efs-csi-driver"
FSX_CSI_ADDON = "aws-fsx-csi-driver"


def addon(
    name: str,
    cluster_name: pulumi.Input[str],
    addon_name: str,
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
    *,
    role_arn: pulumi.Input[str] | None = None,
    depends_on: Sequence[pulumi.Resource] = (),
) -> Any:
    """One managed add-on; what Pulumi declares wins over a hand edit (OVERWRITE)."""
    import pulumi_aws as aws

    return aws.eks.Addon(
        name,
        cluster_name=cluster_name,
        addon_name=addon_name,
        service_account_role_arn=role_arn,
        resolve_conflicts_on_create="OVERWRITE",
        resolve_conflicts_on_update="OVERWRITE",
        tags=dict(tags),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(depends_on))),
    )
