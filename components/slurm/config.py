"""SlurmConfig: what every Slurm pod shares, the generated configuration and the munge key.

* `slurm.conf`, `cgroup.conf` and a `gres-<pool>.conf` per pool in one ConfigMap, rendered by
  `autoheal.slurmconf` (the one generator of Slurm's configuration, the lab's too). Slurm nodes are
  dynamic: no node is named in slurm.conf; each slurmd registers under its Kubernetes node's name
  (workers.py). Jobs are confined by cgroups: a step opens only the GPUs it was given;
* the munge key: 1 KiB of random bytes (components.secrets.RandomSecret) in a Secret, never typed
  into stack config and only ever in state as a secret.

A ConfigMap rather than configless Slurm (`slurmd --conf-server`): the login pod and the runner need
slurm.conf without running a slurmd, every pod starts without waiting on slurmctld to serve it,
and a change shows in `pulumi preview` as a ConfigMap diff and rolls the pods by their config hash.

`SlurmPodParts` is how the controller, the login node and the workers consume them: the volumes,
the mounts, the init container that gives munged a key it accepts, and the munged sidecar every
Slurm pod runs, plus the config hash that rolls a pod template when the configuration changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from autoheal.slurmconf import (
    SlurmConfSpec,
    SlurmPool,
    render_cgroup_conf,
    render_gres_conf,
    render_pool_gres_conf,
    render_slurm_conf,
)
from components import k8sargs
from components.common import SubComponent, base_labels, content_hash
from components.secrets import RandomSecret
from components.slurm import scripts
from components.slurm.layout import (
    CONFIG_DIR,
    CONTROLLER_PORT,
    LOG_DIR,
    MUNGE_DIR,
    MUNGE_KEY_DIR,
    MUNGE_SOCKET_DIR,
    RUN_DIR,
    SPOOL_DIR,
    STATE_DIR,
)


@dataclass(frozen=True)
class SlurmConfigArgs:
    pools: Sequence[SlurmPool]
    namespace: pulumi.Input[str]
    # The namespace's name as a plain string: slurmd finds slurmctld by its cluster DNS name.
    namespace_name: str
    cluster_name: str
    slurm_user: str
    grace_seconds: int
    munge_image: str


def slurm_conf_spec(args: SlurmConfigArgs) -> SlurmConfSpec:
    ctld = f"slurmctld-0(slurmctld-0.slurmctld.{args.namespace_name}.svc.cluster.local)"
    return SlurmConfSpec(
        cluster_name=args.cluster_name,
        controller_host=ctld,
        controller_port=CONTROLLER_PORT,
        pools=list(args.pools),
        state_dir=STATE_DIR,
        spool_dir=SPOOL_DIR,
        log_dir=LOG_DIR,
        run_dir=RUN_DIR,
        slurm_user=args.slurm_user,
        grace_seconds=args.grace_seconds,
        dynamic=True,
        cgroups=True,
    )


@dataclass(frozen=True)
class SlurmPodParts:
    """The pieces every Slurm pod mounts: configuration, munge key and munge socket."""

    volumes: list[k8s.core.v1.VolumeArgs]
    mounts: list[k8s.core.v1.VolumeMountArgs]
    munge_init: k8s.core.v1.ContainerArgs
    munge: k8s.core.v1.ContainerArgs  # a native sidecar: goes in init_containers, after munge_init
    config_map: pulumi.Input[str]
    config_data: dict[str, str]
    config_hash: str

    def pool_config_volume(self, pool: str) -> k8s.core.v1.VolumeArgs:
        """The config volume of one pool's slurmd: slurm.conf, cgroup.conf and that pool's
        gres.conf as the `gres.conf` Slurm reads beside it (it takes no other name)."""
        items = [
            k8s.core.v1.KeyToPathArgs(key="slurm.conf", path="slurm.conf"),
            k8s.core.v1.KeyToPathArgs(key="cgroup.conf", path="cgroup.conf"),
            k8s.core.v1.KeyToPathArgs(key=pool_gres_key(pool), path="gres.conf"),
        ]
        return k8s.core.v1.VolumeArgs(
            name=CONFIG_VOLUME,
            config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=self.config_map, items=items),
        )


CONFIG_VOLUME = "slurm-config"


def pool_gres_key(pool: str) -> str:
    return f"gres-{pool}.conf"


class SlurmConfig(SubComponent):
    """The generated Slurm configuration and the munge key, as a ConfigMap and a Secret."""

    slurm_conf: str
    gres_conf: str
    parts: SlurmPodParts
    munge_key_base64: pulumi.Output[str]  # for clients outside Slurm's namespace (the runner)

    def __init__(
        self, name: str, owner: str, args: SlurmConfigArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:slurm:SlurmConfig", name, owner, opts)
        spec = slurm_conf_spec(args)
        self.slurm_conf = render_slurm_conf(spec)
        self.gres_conf = render_gres_conf(spec)
        data = {
            "slurm.conf": self.slurm_conf,
            "gres.conf": self.gres_conf,  # the controller's and login's: no devices of their own
            "cgroup.conf": render_cgroup_conf(),
            **{pool_gres_key(p.name): render_pool_gres_conf(p) for p in args.pools},
        }
        config_map = k8s.core.v1.ConfigMap(
            f"{owner}-config",
            metadata=k8sargs.meta("slurm-config", args.namespace, base_labels("slurm-config", "config")),
            data=data,
            opts=self.adopt(),
        )
        munge_key = self._munge_key(args.namespace)
        self.parts = _pod_parts(config_map, munge_key, args.munge_image, data)
        self.register_outputs({"configMap": config_map.metadata.name, "mungeKey": munge_key.metadata.name})

    def _munge_key(self, namespace: pulumi.Input[str]) -> k8s.core.v1.Secret:
        owner = self.owner
        munge_bytes = RandomSecret(f"{owner}-munge-bytes", length=1024, opts=self.adopt())
        self.munge_key_base64 = munge_bytes.base64
        return k8s.core.v1.Secret(
            f"{owner}-munge-key",
            metadata=k8sargs.meta("munge-key", namespace, base_labels("munge-key", "munge")),
            type="Opaque",
            data={"munge.key": munge_bytes.base64},
            opts=self.adopt(),
        )


def _pod_parts(
    config_map: k8s.core.v1.ConfigMap, munge_key: k8s.core.v1.Secret, munge_image: str, data: dict[str, str]
) -> SlurmPodParts:
    munge_mounts = [k8sargs.mount("munge-etc", MUNGE_DIR), k8sargs.mount("munge-socket", MUNGE_SOCKET_DIR)]
    init = k8s.core.v1.ContainerArgs(
        name="munge-key",
        image=munge_image,
        command=scripts.script(scripts.munge_init()),
        volume_mounts=[k8sargs.mount("munge-key", MUNGE_KEY_DIR, read_only=True), *munge_mounts],
    )
    # A native sidecar (an init container that keeps running): it starts before the Slurm daemon
    # and stops after it, so slurmd's last `scontrol delete` on SIGTERM can still authenticate.
    munged = k8s.core.v1.ContainerArgs(
        name="munged",
        image=munge_image,
        command=scripts.munged(),
        restart_policy="Always",
        startup_probe=k8s.core.v1.ProbeArgs(
            exec_=k8s.core.v1.ExecActionArgs(command=["test", "-S", f"{MUNGE_SOCKET_DIR}/munge.socket.2"]),
            period_seconds=1,
            failure_threshold=30,
        ),
        volume_mounts=munge_mounts,
    )
    return SlurmPodParts(
        volumes=[
            k8sargs.config_map_volume(CONFIG_VOLUME, config_map.metadata.name),
            k8sargs.secret_volume("munge-key", munge_key.metadata.name),
            k8sargs.empty_dir("munge-etc"),
            k8sargs.empty_dir("munge-socket"),
        ],
        mounts=[
            k8sargs.mount(CONFIG_VOLUME, CONFIG_DIR, read_only=True),
            k8sargs.mount("munge-socket", MUNGE_SOCKET_DIR),
        ],
        munge_init=init,
        munge=munged,
        config_map=config_map.metadata.name,
        config_data=data,
        config_hash=content_hash(data),
    )
