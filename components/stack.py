"""The whole autoheal stack from a validated StackSpec: the one place that wires components.

`__main__.py` only reads `pulumi.Config` and calls `build_stack`; tests call `build_stack` under
Pulumi mocks with a StackSpec of their own, so the wiring is tested without the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pulumi

from autoheal.backends import POOL_CLUSTER_ENV
from components.cluster import EksArgs, KubernetesCluster, KubernetesClusterArgs
from components.common import SecretRef, Taint
from components.config import EksSpec, PoolSpec, RunnerPostgresSpec, StackSpec, resolve_path
from components.eks.nodegroups import SystemNodeGroupArgs, system_selector
from components.eks.platform import ROLE_ARN_ANNOTATION, EksPlatform, EksPlatformArgs
from components.eks.storage import FsxArgs
from components.instances import instance_type
from components.monitoring import (
    DEFAULT_DCGM_IMAGE,
    PROMETHEUS_OPERATOR_URL,
    GpuMonitoring,
    GpuMonitoringArgs,
)
from components.nodepool import EksNodeGroupArgs, GpuNodePool, GpuNodePoolArgs, node_group_name
from components.runner import RUNNER_NAME, RemediationRunner, RemediationRunnerArgs, RunnerPostgresArgs
from components.runner_pod import RunnerSlurmArgs
from components.slurm import SlurmCluster, SlurmClusterArgs, SlurmImages, SlurmStorage, SoftwareVolume


@dataclass
class Stack:
    cluster: KubernetesCluster
    pools: list[GpuNodePool]
    slurm: SlurmCluster
    runner: RemediationRunner
    monitoring: GpuMonitoring
    platform: EksPlatform | None = None  # EKS: device plugins, storage, the runner's IAM role


def build_stack(
    cfg: StackSpec,
    root: Path,
    rules_yaml: str,
    playbooks: Mapping[str, str],
) -> Stack:
    """The cluster, its GPU pools, Slurm, the runner and the monitoring that calls it."""
    cluster = KubernetesCluster("cluster", cluster_args(cfg, root))
    k8s_opts = pulumi.ResourceOptions(provider=cluster.provider)
    pools = [
        GpuNodePool(f"pool-{p.name}", pool_args(p, cluster, cfg.guaranteed(p), cfg.backend(p)), opts=k8s_opts)
        for p in cfg.pools
    ]
    platform = EksPlatform("eks", platform_args(cfg, cluster, pools), opts=k8s_opts) if cluster.eks else None
    slurm = SlurmCluster("slurm", slurm_args(cfg, pools), opts=k8s_opts)
    args = runner_args(cfg, cluster, rules_yaml, playbooks, slurm)
    if platform is not None and cluster.eks is not None and cfg.cluster.eks is not None:
        annotations = {ROLE_ARN_ANNOTATION: platform.runner_role_arn}
        # the aws pool backend's scope (pools/aws.py): this cluster's instances, in its region
        cloud_env: dict[str, pulumi.Input[str]] = {
            POOL_CLUSTER_ENV: cluster.eks.cluster_name,
            "AWS_REGION": cfg.cluster.eks.region,
        }
        args = dataclasses.replace(args, service_account_annotations=annotations, cloud_env=cloud_env)
    runner = RemediationRunner("runner", args, opts=k8s_opts)
    monitoring = GpuMonitoring("monitoring", monitoring_args(cfg, cluster, runner), opts=k8s_opts)
    stack = Stack(cluster, pools, slurm, runner, monitoring, platform)
    export_outputs(stack)
    return stack


def cluster_args(cfg: StackSpec, root: Path) -> KubernetesClusterArgs:
    c = cfg.cluster
    return KubernetesClusterArgs(
        backend=c.backend,
        kubeconfig=str(resolve_path(root, c.kubeconfig)) if c.kubeconfig else None,
        context=c.context,
        namespace=cfg.namespace,
        eks=(
            EksArgs(
                region=c.eks.region,
                subnet_ids=c.eks.subnet_ids,
                version=c.eks.version,
                endpoint_public_access=c.eks.endpoint_public_access,
                public_access_cidrs=c.eks.public_access_cidrs,
                tags=c.eks.tags,
                system_node_group=system_node_group_args(c.eks),
                oidc_thumbprints=c.eks.oidc_thumbprints,
            )
            if c.eks
            else None
        ),
    )


def system_node_group_args(eks: EksSpec) -> SystemNodeGroupArgs:
    s = eks.system_node_group
    return SystemNodeGroupArgs(
        instance_type=s.instance_type,
        size=s.size,
        ami_type=s.ami_type,
        disk_size_gb=s.disk_size_gb,
        labels=dict(s.labels),
    )


def system_pods_selector(cfg: StackSpec, configured: dict[str, str]) -> dict[str, str]:
    """Where the stack's system pods (slurmctld, login, the runner) run: the configured selector,
    else on EKS the stack's own system node group (never a GPU node the runbook drains)."""
    if configured or cfg.cluster.backend != "eks":
        return dict(configured)
    return system_selector()


def platform_args(cfg: StackSpec, cluster: KubernetesCluster, pools: list[GpuNodePool]) -> EksPlatformArgs:
    eks = cfg.cluster.eks
    if cluster.eks is None or eks is None:
        raise ValueError("platform_args: the stack's cluster is not on EKS")
    named = stack_storage_classes(cfg)
    return EksPlatformArgs(
        cluster=cluster.eks,
        pools=[p.placement for p in pools],
        node_groups=[node_group_name(p.name) for p in cfg.pools],
        efa_pools=[p.name for p in cfg.pools if p.eks is not None and p.eks.uses_efa],
        device_plugin=eks.device_plugin,
        device_plugin_image=eks.device_plugin_image,
        gpu_operator_version=eks.gpu_operator_version,
        operator_dcgm_exporter=not cfg.monitoring.dcgm_exporter,
        efa_device_plugin_image=eks.efa_device_plugin_image,
        ebs_class=eks.storage.ebs_class if eks.storage.ebs_class in named else None,
        efs_class=eks.storage.efs_class if eks.storage.efs_class in named else None,
        fsx=(
            FsxArgs(
                class_name=eks.storage.fsx_class,
                deployment_type=eks.storage.fsx_deployment_type,
                throughput=eks.storage.fsx_throughput,
            )
            if eks.storage.fsx_class in named
            else None
        ),
        runner_namespace=cluster.namespace,
        runner_service_account=RUNNER_NAME,
        tags=dict(eks.tags),
    )


def stack_storage_classes(cfg: StackSpec) -> set[str]:
    """The StorageClass names the stack's claims use."""
    st = cfg.slurm.storage
    names = {
        st.state_storage_class,
        st.shared_storage_class,
        st.checkpoint_storage_class,
        cfg.runner.journal_storage_class,
    }
    return {n for n in names if n}


def pool_args(
    p: PoolSpec, cluster: KubernetesCluster, guaranteed: bool = False, backend: str = "none"
) -> GpuNodePoolArgs:
    eks = p.eks if cluster.eks else None
    return GpuNodePoolArgs(
        name=p.name,
        prefix=p.node_prefix,
        size=p.size,
        spares=p.spares,
        namespace=cluster.namespace,
        gpu_model=p.gpu_model,
        gpus_per_node=p.gpus_per_node,
        headroom=p.headroom,
        labels=p.labels,
        taints=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in p.taints),
        cpus=p.cpus,
        real_memory_mb=p.real_memory_mb,
        guaranteed=guaranteed,
        backend=backend,
        remediation=p.remediation,
        waiver=p.waiver,
        eks=(
            EksNodeGroupArgs(
                instance_type=eks.instance_type,
                ami_type=eks.ami_type,
                capacity_type=eks.capacity_type,
                disk_size_gb=eks.disk_size_gb,
                efa_interfaces=instance_type(eks.instance_type).efa_interfaces if eks.uses_efa else 0,
                capacity_reservation_id=eks.capacity_reservation_id,
                subnet_ids=tuple(eks.subnet_ids),
            )
            if eks
            else None
        ),
        eks_cluster=cluster.eks if p.eks else None,
    )


def slurm_args(cfg: StackSpec, pools: list[GpuNodePool]) -> SlurmClusterArgs:
    sc = cfg.slurm
    st = sc.storage
    return SlurmClusterArgs(
        pools=[p.placement for p in pools],
        namespace=sc.namespace,
        cluster_name=sc.cluster_name,
        images=SlurmImages(**{k: v for k, v in sc.images.model_dump().items() if v is not None}),
        storage=SlurmStorage(
            state_size=st.state_size,
            home_size=st.home_size,
            checkpoint_size=st.checkpoint_size,
            state_storage_class=st.state_storage_class,
            shared_storage_class=st.shared_storage_class,
            checkpoint_storage_class=st.checkpoint_storage_class,
            shared_access_mode=st.shared_access_mode,
        ),
        authorized_keys=sc.authorized_keys,
        login_service_type=sc.login_service_type,
        slurm_user=sc.slurm_user,
        grace_seconds=sc.grace_seconds,
        wait_for_rollout=cfg.wait_for_rollout if sc.wait_for_rollout is None else sc.wait_for_rollout,
        tolerate=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in sc.tolerate_taints),
        node_selector=system_pods_selector(cfg, dict(sc.node_selector)),
        software=tuple(
            SoftwareVolume(name=v.name, mount_path=v.mount_path, claim=v.claim, host_path=v.host_path)
            for v in sc.software
        ),
        login_source_ranges=tuple(sc.login_source_ranges),
        login_policy_waiver=sc.login_policy_waiver,
    )


def _cloud_play_vars(cfg: StackSpec) -> dict[str, object]:
    """On a cloud, a retire waits for the pool's replacement (a GPU instance boots and joins in
    minutes): one that does not come within the timeout fails the run once; the node stays fenced."""
    if cfg.cluster.backend != "eks":
        return {}
    return {"autoheal_wait_replacement": True, "autoheal_replacement_timeout": 900}


def _ladder_play_vars(cfg: StackSpec) -> dict[str, object]:
    """The recovery ladder's reset and DCGM diagnostics Jobs run the stack's DCGM image (by digest:
    the ladder refuses a tag; without one the dcgm backend fails, naming the setting) in the
    runner's namespace (its Role allows Jobs there only); evidence reads the stack's Prometheus."""
    mc = cfg.monitoring
    prometheus = mc.prometheus_url or (PROMETHEUS_OPERATOR_URL if mc.prometheus_operator else None)
    return {
        "autoheal_job_namespace": cfg.namespace,
        **({"autoheal_dcgm_image": mc.dcgm_image} if mc.dcgm_image else {}),
        **({"autoheal_prometheus_url": prometheus} if prometheus else {}),
    }


def _cloud_loops(cfg: StackSpec) -> dict[str, object]:
    """On a cloud the leader keeps the spares (a node group's new instance comes up as a plain
    member: nothing else makes it a spare) and deletes dead nodes' Slurm records (an instance
    gone without its slurmd pod stopping); the stack's runner settings may turn either off."""
    if cfg.cluster.backend != "eks":
        return {}
    return {"spare_keeper": {"enabled": True}, "dead_nodes": {"enabled": True}}


def runner_args(
    cfg: StackSpec,
    cluster: KubernetesCluster,
    rules_yaml: str,
    playbooks: Mapping[str, str],
    slurm: SlurmCluster | None = None,
) -> RemediationRunnerArgs:
    """The runner's pod: with `slurm` (and slurmAccess, the default) it reaches that cluster's
    slurmctld through a munge sidecar with the cluster's key and slurm.conf."""
    rc = cfg.runner
    args = RemediationRunnerArgs(
        namespace=cluster.namespace,
        port=rc.port,
        service_port=rc.service_port,
        rules_yaml=rules_yaml,
        playbooks=playbooks,
        settings={
            "grace_seconds": cfg.slurm.grace_seconds,
            # each pool's backend, for the runbook's reboot and retire of its nodes
            "pool_backends": {p.name: cfg.backend(p) for p in cfg.pools},
            **_cloud_loops(cfg),
            **rc.settings,
            "play_vars": {
                **_cloud_play_vars(cfg),
                **_ladder_play_vars(cfg),
                **dict(rc.settings.get("play_vars") or {}),
            },
        },
        dry_run=rc.dry_run,
        journal_size=rc.journal_size,
        journal_storage_class=rc.journal_storage_class,
        service_type=rc.service_type,
        node_port=rc.node_port,
        wait_for_rollout=cfg.wait_for_rollout,
        slurm=slurm_access(slurm) if slurm is not None and rc.slurm_access else None,
        tolerate=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in rc.tolerate_taints),
        node_selector=system_pods_selector(cfg, dict(rc.node_selector)),
        journal=rc.journal,
        postgres=runner_postgres(rc.postgres, cluster.namespace) if rc.postgres is not None else None,
        replicas=rc.replicas,
    )
    return dataclasses.replace(args, image=rc.image) if rc.image else args


def runner_postgres(pg: RunnerPostgresSpec, namespace: pulumi.Input[str]) -> RunnerPostgresArgs:
    """The shared journal of an HA runner; its password a Secret in the runner's namespace."""
    password = (
        SecretRef(name=pg.password.name, key=pg.password.key, namespace=namespace) if pg.password else None
    )
    return RunnerPostgresArgs(url=pg.url, password=password)


def slurm_access(slurm: SlurmCluster) -> RunnerSlurmArgs:
    """What a Slurm client outside Slurm's namespace needs: slurm.conf and the munge key."""
    return RunnerSlurmArgs(
        config={"slurm.conf": slurm.slurm_conf}, munge_key_base64=slurm.config.munge_key_base64
    )


def monitoring_args(
    cfg: StackSpec, cluster: KubernetesCluster, runner: RemediationRunner
) -> GpuMonitoringArgs:
    mc = cfg.monitoring
    return GpuMonitoringArgs(
        webhook_url=runner.webhook_url,
        token_secret=runner.token_secret,
        namespace=cluster.namespace,
        dcgm_image=mc.dcgm_image or DEFAULT_DCGM_IMAGE,
        **({"watcher_image": mc.watcher_image} if mc.watcher_image else {}),
        **({"alertmanager_url": mc.alertmanager_url} if mc.alertmanager_url else {}),
        watcher_kernel_log_dir=mc.watcher_kernel_log_dir,
        watcher_resend_seconds=mc.watcher_resend_seconds,
        watcher_hold_seconds=mc.watcher_hold_seconds,
        dcgm_exporter=mc.dcgm_exporter,
        prometheus_operator=mc.prometheus_operator,
        operator_labels=dict(mc.operator_labels),
        alertmanager_secrets_dir=mc.alertmanager_secrets_dir,
        wait_for_rollout=cfg.wait_for_rollout,
    )


def export_outputs(stack: Stack) -> None:
    """The stack outputs users and the lab read (`pulumi stack output`)."""
    pulumi.export("namespace", stack.cluster.namespace)
    pulumi.export("slurmNamespace", stack.slurm.namespace.metadata.name)
    pulumi.export("loginService", stack.slurm.login_service.metadata.name)
    pulumi.export("loginHostKey", stack.slurm.login_host_key)
    pulumi.export("webhookUrl", stack.runner.webhook_url)
    pulumi.export("pools", {p.slurm_pool.name: p.slurm_pool.node_names() for p in stack.pools})
    if stack.cluster.eks is not None and stack.platform is not None:
        # what `aws eks update-kubeconfig --name` and an audit of the runner's AWS rights need
        pulumi.export("eksClusterName", stack.cluster.eks.cluster_name)
        pulumi.export("runnerRoleArn", stack.platform.runner_role_arn)
