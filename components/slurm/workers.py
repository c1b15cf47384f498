"""SlurmWorkers: one slurmd DaemonSet per GPU pool, on that pool's nodes with all their GPUs.

A DaemonSet (not a StatefulSet) keeps the Slurm node name equal to the Kubernetes node name
(`slurmd -N $(NODE_NAME)`), the identity the runbook uses by default, and it follows
replacements: a node the pool controller adds gets its slurmd with no change to anything Pulumi
owns. The pods are pinned to the pool's label, tolerate the pool's taints and the hot-spare taint
(spares run slurmd too, DRAIN until promoted), and request every GPU of the node. The update
strategy is `OnDelete`, so a config change never restarts slurmd under a running training job;
configuration reaches running slurmd through the mounted ConfigMap and `scontrol reconfigure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from components import kube
from components.common import SubComponent, base_labels
from components.nodepool import PoolPlacement
from components.slurm.config import SlurmPodParts
from components.slurm.layout import CONFIG_DIR, SLURMD_PORT, SPOOL_DIR


@dataclass(frozen=True)
class SlurmWorkersArgs:
    placement: PoolPlacement
    namespace: pulumi.Input[str]
    image: str
    grace_seconds: int
    parts: SlurmPodParts
    shared_volumes: Sequence[k8s.core.v1.VolumeArgs]
    shared_mounts: Sequence[k8s.core.v1.VolumeMountArgs]
    annotations: dict[str, str]  # on the DaemonSet (e.g. skipAwait)


class SlurmWorkers(SubComponent):
    daemon_set: k8s.apps.v1.DaemonSet

    def __init__(
        self, name: str, owner: str, args: SlurmWorkersArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:slurm:SlurmWorkers", name, owner, opts)
        pool = args.placement.pool.name
        labels = {**base_labels(f"slurmd-{pool}", "slurmd"), lb.POOL_LABEL: pool}
        self.daemon_set = k8s.apps.v1.DaemonSet(
            f"{owner}-slurmd-{pool}",
            metadata=kube.meta(f"slurmd-{pool}", args.namespace, labels, args.annotations),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=kube.selector(labels),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="OnDelete"),
                template=kube.template(labels, _pod(args)),
            ),
            opts=self.adopt(),
        )
        self.register_outputs({"daemonSet": self.daemon_set.metadata.name, "pool": pool})


def _pod(args: SlurmWorkersArgs) -> k8s.core.v1.PodSpecArgs:
    placement = args.placement
    return k8s.core.v1.PodSpecArgs(
        host_network=True,
        dns_policy="ClusterFirstWithHostNet",
        # slurmd gets the job's grace period (KillWait) and some time to report back.
        termination_grace_period_seconds=args.grace_seconds + 30,
        affinity=kube.required_node_affinity(
            [kube.node_has(k, v) for k, v in sorted(placement.selector.items())]
        ),
        tolerations=placement.tolerations(),
        containers=[_slurmd(args), args.parts.munge],
        volumes=[*args.parts.volumes, *args.shared_volumes, kube.empty_dir("spool")],
    )


def _slurmd(args: SlurmWorkersArgs) -> k8s.core.v1.ContainerArgs:
    gpus = str(args.placement.pool.gpus_per_node)
    return k8s.core.v1.ContainerArgs(
        name="slurmd",
        image=args.image,
        command=["slurmd", "-D", "-N", "$(NODE_NAME)", "-f", f"{CONFIG_DIR}/slurm.conf"],
        env=[kube.field_env("NODE_NAME", "spec.nodeName")],
        ports=[k8s.core.v1.ContainerPortArgs(name="slurmd", container_port=SLURMD_PORT)],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={lb.GPU_RESOURCE: gpus}, limits={lb.GPU_RESOURCE: gpus}
        ),
        volume_mounts=[*args.parts.mounts, *args.shared_mounts, kube.mount("spool", SPOOL_DIR)],
        readiness_probe=kube.tcp_probe(SLURMD_PORT, 5),
        liveness_probe=kube.tcp_probe(SLURMD_PORT, 30, 20),
    )
