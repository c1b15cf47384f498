"""The whole autoheal stack from a validated StackConfig: the one place that wires components.

`__main__.py` only reads `pulumi.Config` and calls `build_stack`; tests call `build_stack` under
Pulumi mocks with a StackConfig of their own, so the wiring is tested without the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pulumi

from components.cluster import EksArgs, KubernetesCluster, KubernetesClusterArgs
from components.common import Taint
from components.config import StackConfig, resolve_path
from components.monitoring import DEFAULT_DCGM_IMAGE, GpuMonitoring, GpuMonitoringArgs
from components.nodepool import EksNodeGroupArgs, GpuNodePool, GpuNodePoolArgs
from components.runner import RemediationRunner, RemediationRunnerArgs
from components.slurm import SlurmCluster, SlurmClusterArgs, SlurmImages, SlurmStorage


@dataclass
class Stack:
    cluster: KubernetesCluster
    pools: list[GpuNodePool]
    slurm: SlurmCluster
    runner: RemediationRunner
    monitoring: GpuMonitoring


def build_stack(
    cfg: StackConfig,
    root: Path,
    rules_yaml: str,
    playbooks: Mapping[str, str],
) -> Stack:
    cluster_args = KubernetesClusterArgs(
        backend=cfg.cluster.backend,
        kubeconfig=(str(resolve_path(root, cfg.cluster.kubeconfig)) if cfg.cluster.kubeconfig else None),
        context=cfg.cluster.context,
        namespace=cfg.namespace,
        eks=(
            EksArgs(
                region=cfg.cluster.eks.region,
                subnet_ids=cfg.cluster.eks.subnet_ids,
                version=cfg.cluster.eks.version,
                endpoint_public_access=cfg.cluster.eks.endpoint_public_access,
                public_access_cidrs=cfg.cluster.eks.public_access_cidrs,
                tags=cfg.cluster.eks.tags,
            )
            if cfg.cluster.eks
            else None
        ),
    )
    cluster = KubernetesCluster("cluster", cluster_args)
    k8s_opts = pulumi.ResourceOptions(provider=cluster.provider)

    ns = cluster.namespace

    pools = [
        GpuNodePool(
            f"pool-{p.name}",
            GpuNodePoolArgs(
                name=p.name,
                prefix=p.node_prefix,
                size=p.size,
                spares=p.spares,
                namespace=ns,
                gpu_model=p.gpu_model,
                gpus_per_node=p.gpus_per_node,
                headroom=p.headroom,
                labels=p.labels,
                taints=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in p.taints),
                cpus=p.cpus,
                real_memory_mb=p.real_memory_mb,
                remediation=p.remediation,
                waiver=p.waiver,
                eks=(
                    EksNodeGroupArgs(
                        instance_type=p.eks.instance_type,
                        ami_type=p.eks.ami_type,
                        capacity_type=p.eks.capacity_type,
                        disk_size_gb=p.eks.disk_size_gb,
                    )
                    if p.eks and cluster.eks
                    else None
                ),
                eks_cluster=cluster.eks if p.eks else None,
            ),
            opts=k8s_opts,
        )
        for p in cfg.pools
    ]

    sc = cfg.slurm
    images = SlurmImages(
        **{k: v for k, v in sc.images.model_dump().items() if v is not None},
    )
    slurm = SlurmCluster(
        "slurm",
        SlurmClusterArgs(
            pools=[p.placement for p in pools],
            namespace=sc.namespace,
            cluster_name=sc.cluster_name,
            images=images,
            storage=SlurmStorage(
                state_size=sc.storage.state_size,
                home_size=sc.storage.home_size,
                checkpoint_size=sc.storage.checkpoint_size,
                state_storage_class=sc.storage.state_storage_class,
                shared_storage_class=sc.storage.shared_storage_class,
                shared_access_mode=sc.storage.shared_access_mode,
            ),
            authorized_keys=sc.authorized_keys,
            login_service_type=sc.login_service_type,
            slurm_user=sc.slurm_user,
            grace_seconds=sc.grace_seconds,
            wait_for_rollout=cfg.wait_for_rollout,
        ),
        opts=k8s_opts,
    )

    rc = cfg.runner
    runner_args = RemediationRunnerArgs(
        namespace=ns,
        port=rc.port,
        service_port=rc.service_port,
        rules_yaml=rules_yaml,
        playbooks=playbooks,
        settings={"grace_seconds": sc.grace_seconds, **rc.settings},
        dry_run=rc.dry_run,
        journal_size=rc.journal_size,
        journal_storage_class=rc.journal_storage_class,
        service_type=rc.service_type,
        wait_for_rollout=cfg.wait_for_rollout,
    )
    if rc.image:
        runner_args = dataclasses.replace(runner_args, image=rc.image)
    runner = RemediationRunner("runner", runner_args, opts=k8s_opts)

    mc = cfg.monitoring
    monitoring = GpuMonitoring(
        "monitoring",
        GpuMonitoringArgs(
            webhook_url=runner.webhook_url,
            token_secret=runner.token_secret,
            namespace=ns,
            dcgm_image=mc.dcgm_image or DEFAULT_DCGM_IMAGE,
            prometheus_operator=mc.prometheus_operator,
            alertmanager_secrets_dir=mc.alertmanager_secrets_dir,
            wait_for_rollout=cfg.wait_for_rollout,
        ),
        opts=k8s_opts,
    )

    pulumi.export("namespace", ns)
    pulumi.export("slurmNamespace", slurm.namespace.metadata.name)
    pulumi.export("loginService", slurm.login_service.metadata.name)
    pulumi.export("loginHostKey", slurm.login_host_key)
    pulumi.export("webhookUrl", runner.webhook_url)
    pulumi.export("pools", {p.slurm_pool.name: p.slurm_pool.node_names() for p in pools})
    return Stack(cluster, pools, slurm, runner, monitoring)
