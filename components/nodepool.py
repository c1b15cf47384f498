"""GpuNodePool: declares a pool of GPU nodes (size, hot spares, GPU model, labels, taints).

Code declares pools; the runtime replaces nodes. So this component never declares a Node object:
it writes the pool's *description* into a ConfigMap in the autoheal namespace, which the pool's
controller reads (the lab's pool controller keeps the pool at that size with simulated nodes; on a
cloud the autoscaling group does it). After the runbook retires a node and the controller brings a
new one, nothing that Pulumi owns has changed, so `pulumi preview` shows no diff and a later
`pulumi up` never resurrects a retired node nor undoes a promotion.

The ConfigMap (`autoheal-pool-<name>`, labelled `app.kubernetes.io/component=node-pool` and
`autoheal.io/pool=<name>`) holds one key, `pool.json`:

    {"name", "prefix", "size", "spares", "headroom", "desiredNodes", "gpuModel", "gpusPerNode",
     "nodeLabels", "taints": [{"key","value"?,"effect"}],
     "spare": {"label": {"key","value"}, "taint": {"key","value","effect"}},
     "nodeNames": {"active": [...], "spares": [...], "future": [...]},
     "remediation": {"enabled": bool, "waiver": str | null}, "cluster": "kubeconfig" | "eks",
     "backend": "lab" | "aws" | "karpenter" | "none"}

`backend` is how the runbook reboots and retires the pool's nodes (pools/, autoheal.backends).

Spares are nodes of the same pool that additionally carry the label `autoheal.io/spare=true` and
the taint `autoheal.io/spare=true:NoSchedule` (and are DRAIN in Slurm) until the runbook promotes
one. With the EKS backend the pool is also a managed node group of `size + spares` instances with
the pool's labels and taints; which of them are spares is runtime state, not code.

The `slurm_pool` output is the pool as Slurm sees it, for SlurmCluster.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from autoheal.backends import POOL_BACKENDS
from autoheal.names import is_node_name
from autoheal.slurmconf import SlurmPool
from components.cluster import EksCluster
from components.common import SPARE_TAINT, Taint, base_labels, child
from components.eks import launch
from components.eks.launch import LaunchArgs

_EKS_TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}


def node_group_name(pool: str) -> str:
    """The managed node group of a pool (EKS tags its instances with it: the runner's IAM policy
    acts on those instances only)."""
    return f"autoheal-{pool}"


@dataclass(frozen=True)
class EksNodeGroupArgs:
    instance_type: str = "p5.48xlarge"
    ami_type: str = "AL2023_x86_64_NVIDIA"
    capacity_type: str = "ON_DEMAND"
    disk_size_gb: int = 200
    # EFA interfaces per instance (0: none); with them, a cluster placement group (one zone)
    efa_interfaces: int = 0
    capacity_reservation_id: str | None = None  # a reservation or capacity block to launch into
    # the pool's subnets (none: the cluster's; with EFA, the first of them: one zone)
    subnet_ids: Sequence[str] = ()

    def launch(self, security_group_id: pulumi.Input[str] | None) -> LaunchArgs:
        return LaunchArgs(
            efa_interfaces=self.efa_interfaces,
            capacity_reservation_id=self.capacity_reservation_id,
            capacity_block=self.capacity_type == "CAPACITY_BLOCK",
            disk_size_gb=self.disk_size_gb,
            security_group_id=security_group_id,
        )

    def subnets(self, cluster_subnets: Sequence[str]) -> list[str]:
        if self.subnet_ids:
            return list(self.subnet_ids)
        return list(cluster_subnets[:1]) if self.efa_interfaces else list(cluster_subnets)


@dataclass(frozen=True)
class GpuNodePoolArgs:
    name: str
    prefix: str
    size: int
    spares: int
    namespace: pulumi.Input[str] = "autoheal"
    gpu_model: str = "h100"
    gpus_per_node: int = 8
    headroom: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    cpus: int = 2
    real_memory_mb: int = 1000
    guaranteed: bool = False  # PoolPlacement.guaranteed
    backend: str = "none"  # autoheal.backends: how the runbook reboots and retires its nodes
    remediation: bool = True
    # A reason recorded on the pool when it runs without spares or without remediation on purpose;
    # the policy pack accepts such a pool only when this is set.
    waiver: str | None = None
    # EKS backend: both set, or neither (the pool controller of an existing cluster does the work).
    eks: EksNodeGroupArgs | None = None
    eks_cluster: EksCluster | None = None

    def validate(self) -> None:
        if not is_node_name(self.name) or "." in self.name:
            raise ValueError(f"pool name {self.name!r} must be a DNS label (a-z, 0-9, '-')")
        if not is_node_name(f"{self.prefix}-1"):
            raise ValueError(f"pool {self.name}: prefix {self.prefix!r} does not make node names")
        if self.size < 1:
            raise ValueError(f"pool {self.name}: size must be at least 1, got {self.size}")
        if self.spares < 0 or self.headroom < 0:
            raise ValueError(f"pool {self.name}: spares and headroom must not be negative")
        if self.gpus_per_node < 1:
            raise ValueError(f"pool {self.name}: gpus_per_node must be at least 1")
        if self.backend not in POOL_BACKENDS:
            known = ", ".join(POOL_BACKENDS)
            raise ValueError(f"pool {self.name}: backend {self.backend!r} is not one of {known}")
        if (self.eks is None) != (self.eks_cluster is None):
            raise ValueError(f"pool {self.name}: eks and eks_cluster go together")


@dataclass(frozen=True)
class PoolPlacement:
    """How a pod is put on this pool's nodes (spares included): the pool label to select on and
    the taints to tolerate."""

    pool: SlurmPool
    selector: dict[str, str]
    taints: tuple[Taint, ...]
    # slurmd's pod requests (= limits) the pool's cpus and realMemoryMb: Guaranteed, so the kubelet
    # evicts it last and Slurm's view of the node is what the pod really has
    guaranteed: bool = False

    def tolerations(self) -> list[k8s.core.v1.TolerationArgs]:
        return [t.toleration() for t in self.taints]


class GpuNodePool(pulumi.ComponentResource):
    slurm_pool: SlurmPool
    placement: PoolPlacement
    node_labels: dict[str, str]
    config_map: k8s.core.v1.ConfigMap
    node_group: pulumi.CustomResource | None

    def __init__(self, name: str, args: GpuNodePoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("autoheal:nodepool:GpuNodePool", name, None, opts)
        args.validate()
        self.slurm_pool = SlurmPool(
            name=args.name,
            prefix=args.prefix,
            size=args.size,
            spares=args.spares,
            headroom=args.headroom,
            gpus_per_node=args.gpus_per_node,
            gpu_type=args.gpu_model,
            cpus=args.cpus,
            real_memory_mb=args.real_memory_mb,
        )
        self.node_labels = {**args.labels, lb.POOL_LABEL: args.name, lb.GPU_MODEL_LABEL: args.gpu_model}
        self.placement = PoolPlacement(
            pool=self.slurm_pool,
            selector={lb.POOL_LABEL: args.name},
            taints=(*args.taints, SPARE_TAINT),
            guaranteed=args.guaranteed,
        )
        annotations = {lb.REMEDIATION_ANNOTATION: "enabled" if args.remediation else "disabled"}
        if args.waiver:
            annotations[lb.POLICY_WAIVER_ANNOTATION] = args.waiver
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-pool",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=f"autoheal-pool-{args.name}",
                namespace=args.namespace,
                labels={**base_labels("autoheal-pool", lb.NODE_POOL_COMPONENT), lb.POOL_LABEL: args.name},
                annotations=annotations,
            ),
            data={"pool.json": describe_pool(args, self.slurm_pool, self.node_labels)},
            opts=child(self),
        )
        self.node_group = None
        if args.eks is not None and args.eks_cluster is not None:
            self.node_group = self._eks_node_group(name, args, args.eks, args.eks_cluster)
        self.register_outputs(
            {
                "poolName": args.name,
                "desiredNodes": args.size + args.spares,
                "configMap": self.config_map.metadata.name,
            }
        )

    def _eks_node_group(
        self, name: str, args: GpuNodePoolArgs, ng: EksNodeGroupArgs, cluster: EksCluster
    ) -> pulumi.CustomResource:
        import pulumi_aws as aws

        desired = args.size + args.spares
        template = self._launch_template(name, args, ng, cluster)
        group: pulumi.CustomResource = aws.eks.NodeGroup(
            f"{name}-nodegroup",
            cluster_name=cluster.cluster_name,
            node_group_name=node_group_name(args.name),
            node_role_arn=cluster.node_role_arn,
            subnet_ids=ng.subnets(cluster.subnet_ids),
            instance_types=[ng.instance_type],
            ami_type=ng.ami_type,
            capacity_type=ng.capacity_type,
            # with a launch template the root disk is the template's (EKS refuses both)
            disk_size=ng.disk_size_gb if template is None else None,
            launch_template=(
                aws.eks.NodeGroupLaunchTemplateArgs(
                    id=template.id, version=template.latest_version.apply(str)
                )
                if template is not None
                else None
            ),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=desired, min_size=desired, max_size=desired + max(args.headroom, 1)
            ),
            labels=self.node_labels,
            taints=[
                aws.eks.NodeGroupTaintArgs(key=t.key, value=t.value, effect=_EKS_TAINT_EFFECTS[t.effect])
                for t in args.taints
            ],
            tags={**cluster.tags, lb.POOL_LABEL: args.name},
            # its nodes become Ready only with the networking add-ons, and join only with the
            # node role's policies attached
            opts=child(self, provider=cluster.aws_provider, depends_on=list(cluster.node_dependencies)),
        )
        return group

    def _launch_template(
        self, name: str, args: GpuNodePoolArgs, ng: EksNodeGroupArgs, cluster: EksCluster
    ) -> Any | None:
        """EFA interfaces in a cluster placement group and a capacity reservation, where the pool
        needs them (components/eks/launch.py); None: the node group's defaults do."""
        launch_args = ng.launch(cluster.security_group_id)
        if not launch.needs_launch_template(launch_args):
            return None
        opts = child(self, provider=cluster.aws_provider)
        tags = {**cluster.tags, lb.POOL_LABEL: args.name}
        group = launch.placement_group(f"{name}-placement", tags, opts) if ng.efa_interfaces else None
        return launch.launch_template(f"{name}-launch", launch_args, group, tags, opts)


def describe_pool(args: GpuNodePoolArgs, pool: SlurmPool, node_labels: Mapping[str, str]) -> str:
    """The pool description the pool controller and the runbook read (stable JSON text)."""
    doc = {
        "name": args.name,
        "prefix": args.prefix,
        "size": args.size,
        "spares": args.spares,
        "headroom": args.headroom,
        "desiredNodes": args.size + args.spares,
        "gpuModel": args.gpu_model,
        "gpusPerNode": args.gpus_per_node,
        "nodeLabels": dict(sorted(node_labels.items())),
        "taints": [t.as_dict() for t in args.taints],
        "spare": {
            "label": {"key": lb.SPARE_LABEL, "value": "true"},
            "taint": SPARE_TAINT.as_dict(),
        },
        "nodeNames": {
            "active": pool.active_nodes(),
            "spares": pool.spare_nodes(),
            "future": pool.future_nodes(),
        },
        "remediation": {"enabled": args.remediation, "waiver": args.waiver},
        "cluster": "eks" if args.eks is not None else "kubeconfig",
        "backend": args.backend,
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
