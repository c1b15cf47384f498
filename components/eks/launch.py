"""A GPU pool's launch template, where its instances need more than a managed node group's
defaults: EFA network interfaces in a cluster placement group, and a capacity reservation.

* EFA: one interface per network card the instance type has (components/instances.py: p5.48xlarge
  32, p4d.24xlarge 4), the first the primary (device 0), the others device 1 on their own card,
  as AWS documents for multi-card instances. NCCL over EFA wants the nodes close: a cluster
  placement group, which lives in one availability zone, so an EFA pool launches in one subnet.
* A capacity reservation (On-Demand Capacity Reservation, or a capacity block for ML, with the
  node group's capacityType CAPACITY_BLOCK): the instances launch into it, by its id.

A launch template that names network interfaces must name the security groups on them: the
cluster security group, which EKS otherwise puts on every node. The root volume moves from the
node group's `disk_size` into the template (EKS refuses both).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

ROOT_DEVICE = "/dev/xvda"  # the EKS AL2023 AMIs' root volume


@dataclass(frozen=True)
class LaunchArgs:
    efa_interfaces: int  # 0: no EFA
    capacity_reservation_id: str | None
    capacity_block: bool  # the reservation is a capacity block (market type capacity-block)
    disk_size_gb: int
    security_group_id: pulumi.Input[str] | None  # the cluster security group (EFA interfaces)


def needs_launch_template(args: LaunchArgs) -> bool:
    return args.efa_interfaces > 0 or args.capacity_reservation_id is not None


def placement_group(name: str, tags: Mapping[str, str], opts: pulumi.ResourceOptions) -> Any:
    import pulumi_aws as aws

    return aws.ec2.PlacementGroup(name, strategy="cluster", tags=dict(tags), opts=opts)


def launch_template(
    name: str,
    args: LaunchArgs,
    group: Any | None,
    tags: Mapping[str, str],
    opts: pulumi.ResourceOptions,
) -> Any:
    """The pool's template: EFA interfaces and the placement group, the reservation, the root disk."""
    import pulumi_aws as aws

    interfaces = [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            device_index=0 if card == 0 else 1,
            network_card_index=card,
            interface_type="efa",
            delete_on_termination="true",
            security_groups=[args.security_group_id] if args.security_group_id is not None else None,
        )
        for card in range(args.efa_interfaces)
    ]
    reservation = (
        aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=args.capacity_reservation_id
            )
        )
        if args.capacity_reservation_id
        else None
    )
    return aws.ec2.LaunchTemplate(
        name,
        network_interfaces=interfaces or None,
        placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=group.name) if group is not None else None,
        capacity_reservation_specification=reservation,
        instance_market_options=(
            aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")
            if args.capacity_block
            else None
        ),
        block_device_mappings=[
            aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_size=args.disk_size_gb,
                    volume_type="gp3",
                    encrypted="true",
                    delete_on_termination="true",
                ),
            )
        ],
        tag_specifications=[
            aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="instance", tags=dict(tags))
        ],
        tags=dict(tags),
        opts=opts,
    )
