"""Node groups besides the GPU pools: the system node group, where everything that is not a GPU
workload runs (CoreDNS, the CSI controllers, slurmctld, login, the runner).

The GPU pools are tainted so that only GPU work lands there, and the runbook drains their nodes;
a cluster with only GPU pools leaves CoreDNS and the stack's own controllers Pending (they
tolerate nothing), and tolerating the taint would put them on nodes the runbook drains. The system
group is untainted and labelled `autoheal.io/role=system`, which the stack's system pods select.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from autoheal import labels as lb


@dataclass(frozen=True)
class SystemNodeGroupArgs:
    instance_type: str = "m7i.xlarge"
    size: int = 2  # two: CoreDNS and the CSI controllers keep a replica through one node's loss
    ami_type: str = "AL2023_x86_64_STANDARD"
    disk_size_gb: int = 50
    labels: Mapping[str, str] = field(default_factory=dict)

    def node_labels(self) -> dict[str, str]:
        return {**self.labels, lb.ROLE_LABEL: lb.SYSTEM_ROLE}


def system_selector() -> dict[str, str]:
    """What a pod selects to run on the system node group."""
    return {lb.ROLE_LABEL: lb.SYSTEM_ROLE}


def system_node_group(
    name: str,
    cluster_name: pulumi.Input[str],
    node_role_arn: pulumi.Input[str],
    subnet_ids: Sequence[str],
    args: SystemNodeGroupArgs,
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> Any:
    """An untainted managed node group of `size` instances (one more while it rolls)."""
    import pulumi_aws as aws

    return aws.eks.NodeGroup(
        name,
        cluster_name=cluster_name,
        node_group_name="autoheal-system",
        node_role_arn=node_role_arn,
        subnet_ids=list(subnet_ids),
        instance_types=[args.instance_type],
        ami_type=args.ami_type,
        capacity_type="ON_DEMAND",
        disk_size=args.disk_size_gb,
        scaling_config=aws.eks.NodeGroupScalingConfigArgs(
            desired_size=args.size, min_size=args.size, max_size=args.size + 1
        ),
        labels=args.node_labels(),
        taints=[],  # explicit: nothing but the system pods' selector keeps GPU work off (it requests GPUs)
        tags={**tags, lb.ROLE_LABEL: lb.SYSTEM_ROLE},
        opts=opts,
    )
