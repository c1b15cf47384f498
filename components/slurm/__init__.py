"""SlurmCluster: Slurm on Kubernetes, its configuration generated from the declared GPU pools.

In its own namespace, one child component per part of the architecture:

* `SlurmConfig` (config.py): slurm.conf, each pool's gres.conf and the munge key;
* `SlurmSharedStorage` (storage.py): /home and /checkpoints, shared by login and workers;
* `SlurmController` (controller.py): slurmctld, its state on a PersistentVolumeClaim;
* `SlurmLogin` (login.py): sshd with the users' keys and a host key made once;
* `SlurmWorkers` (workers.py): one slurmd DaemonSet per GPU pool.

The children's resources keep the logical names they had when SlurmCluster declared them itself
(`slurm-slurmctld`, `slurm-config`, ...) and an alias to it, so stacks made before the split see
no replacement (components.common.SubComponent).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components import k8sargs
from components.common import Taint, await_annotations, base_labels, child
from components.nodepool import PoolPlacement
from components.slurm.config import SlurmConfig, SlurmConfigArgs, slurm_conf_spec
from components.slurm.controller import SlurmController, SlurmControllerArgs
from components.slurm.layout import DEFAULT_IMAGE, STATE_DIR
from components.slurm.login import SlurmLogin, SlurmLoginArgs
from components.slurm.scripts import ClusterUser
from components.slurm.storage import SlurmSharedStorage, SlurmStorage, SoftwareVolume
from components.slurm.workers import SlurmWorkers, SlurmWorkersArgs, slurmd_identity

__all__ = [
    "STATE_DIR",
    "ClusterUser",
    "SlurmCluster",
    "SlurmClusterArgs",
    "SlurmImages",
    "SlurmStorage",
    "SoftwareVolume",
    "slurm_conf_spec",
]


@dataclass(frozen=True)
class SlurmImages:
    controller: str = DEFAULT_IMAGE
    slurmd: str = DEFAULT_IMAGE
    login: str = DEFAULT_IMAGE
    munge: str = DEFAULT_IMAGE


@dataclass(frozen=True)
class SlurmClusterArgs:
    pools: Sequence[PoolPlacement]
    namespace: str = "slurm"
    cluster_name: str = "autoheal"
    images: SlurmImages = field(default_factory=SlurmImages)
    storage: SlurmStorage = field(default_factory=SlurmStorage)
    authorized_keys: Sequence[str] = ()
    login_service_type: str = "ClusterIP"
    slurm_user: str = "slurm"
    grace_seconds: int = 120
    wait_for_rollout: bool = True
    user: ClusterUser = field(default_factory=ClusterUser)  # who logs in and runs jobs
    # taints slurmctld and the login node tolerate: none by default (they belong on system nodes)
    tolerate: Sequence[Taint] = ()
    # labels a node must carry to run slurmctld and the login node (e.g. system nodes); none: any
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # read-only software trees (the jobs' Python, PyTorch) in the login and slurmd pods
    software: Sequence[SoftwareVolume] = ()
    # a LoadBalancer login admits SSH from these CIDRs (SlurmLoginArgs.source_ranges)
    login_source_ranges: Sequence[str] = ()
    login_policy_waiver: str | None = None

    def validate(self, name: str) -> None:
        if not self.pools:
            raise ValueError(f"SlurmCluster {name}: at least one GPU pool is needed")
        names = [p.pool.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"SlurmCluster {name}: pool names repeat: {names}")


class SlurmCluster(pulumi.ComponentResource):
    namespace: k8s.core.v1.Namespace
    config: SlurmConfig
    storage: SlurmSharedStorage
    controller: SlurmController
    login: SlurmLogin
    workers: dict[str, SlurmWorkers]

    def __init__(self, name: str, args: SlurmClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("autoheal:slurm:SlurmCluster", name, None, opts)
        args.validate(name)
        self.namespace = k8s.core.v1.Namespace(
            f"{name}-ns",
            metadata=k8sargs.meta(args.namespace, None, base_labels("slurm", "namespace")),
            opts=child(self),
        )
        ns = self.namespace.metadata.name
        skip = await_annotations(args.wait_for_rollout)
        tolerations = [t.toleration() for t in args.tolerate]
        self.config = SlurmConfig(f"{name}-config", name, _config_args(args, ns), opts=child(self))
        parts = self.config.parts
        self.storage = SlurmSharedStorage(
            f"{name}-storage", name, args.storage, ns, skip, opts=child(self), software=args.software
        )
        self.controller = SlurmController(
            f"{name}-controller",
            name,
            SlurmControllerArgs(
                ns,
                args.images.controller,
                args.storage,
                parts,
                skip,
                args.slurm_user,
                args.user,
                tolerations,
                dict(args.node_selector),
            ),
            opts=child(self),
        )
        self.login = SlurmLogin(
            f"{name}-login", name, self._login_args(args, ns, skip, tolerations), opts=child(self)
        )
        slurmd_sa = slurmd_identity(self, name, ns)
        self.workers = {
            p.pool.name: SlurmWorkers(
                f"{name}-workers-{p.pool.name}",
                name,
                self._workers_args(args, p, ns, skip, slurmd_sa),
                opts=child(self),
            )
            for p in args.pools
        }
        self.register_outputs(
            {
                "namespace": ns,
                "loginService": self.login.service.metadata.name,
                "loginHostKey": self.login.host_key,
                "pools": list(self.workers),
            }
        )

    # The generated configuration files, for callers and tests.
    @property
    def slurm_conf(self) -> str:
        return self.config.slurm_conf

    @property
    def login_service(self) -> k8s.core.v1.Service:
        return self.login.service

    @property
    def login_host_key(self) -> pulumi.Output[str]:
        return self.login.host_key

    def _login_args(
        self,
        args: SlurmClusterArgs,
        ns: pulumi.Input[str],
        skip: dict[str, str],
        tolerations: list[k8s.core.v1.TolerationArgs],
    ) -> SlurmLoginArgs:
        return SlurmLoginArgs(
            namespace=ns,
            image=args.images.login,
            cluster_name=args.cluster_name,
            authorized_keys=args.authorized_keys,
            service_type=args.login_service_type,
            parts=self.config.parts,
            shared_volumes=self.storage.volumes,
            shared_mounts=self.storage.mounts,
            annotations=skip,
            user=args.user,
            tolerations=tolerations,
            node_selector=dict(args.node_selector),
            source_ranges=tuple(args.login_source_ranges),
            policy_waiver=args.login_policy_waiver,
        )

    def _workers_args(
        self,
        args: SlurmClusterArgs,
        placement: PoolPlacement,
        ns: pulumi.Input[str],
        skip: dict[str, str],
        service_account: pulumi.Input[str],
    ) -> SlurmWorkersArgs:
        return SlurmWorkersArgs(
            placement=placement,
            namespace=ns,
            image=args.images.slurmd,
            grace_seconds=args.grace_seconds,
            parts=self.config.parts,
            shared_volumes=self.storage.volumes,
            shared_mounts=self.storage.mounts,
            annotations=skip,
            user=args.user,
            service_account=service_account,
        )


def _config_args(args: SlurmClusterArgs, ns: pulumi.Input[str]) -> SlurmConfigArgs:
    return SlurmConfigArgs(
        pools=[p.pool for p in args.pools],
        namespace=ns,
        namespace_name=args.namespace,
        cluster_name=args.cluster_name,
        slurm_user=args.slurm_user,
        grace_seconds=args.grace_seconds,
        munge_image=args.images.munge,
    )
