"""SlurmLogin: the login node users ssh into to run sbatch, with a host key made once.

sshd runs in a Deployment behind a Service (ClusterIP, NodePort or LoadBalancer). Its authorised
keys come from the arguments (a ConfigMap); its ed25519 host key is generated once
(components.secrets.SshHostKey) into a Secret, so users' known_hosts entries survive a restart.
The login node mounts the Slurm configuration, munge and the shared /home and /checkpoints.
Users log in as the cluster's user (scripts.ClusterUser) with a key from the declared list: no
passwords, no root login, no PAM (a container has no login session to register).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from components import k8sargs
from components.common import SubComponent, base_labels, content_hash
from components.secrets import SshHostKey
from components.slurm import scripts
from components.slurm.config import SlurmPodParts
from components.slurm.layout import AUTHORIZED_KEYS_DIR, CONFIG_DIR, HOST_KEY_DIR, SSH_PORT
from components.slurm.scripts import ClusterUser

HOST_KEY_FILE = "ssh_host_ed25519_key"


@dataclass(frozen=True)
class SlurmLoginArgs:
    namespace: pulumi.Input[str]
    image: str
    cluster_name: str
    authorized_keys: Sequence[str]
    service_type: str
    parts: SlurmPodParts
    shared_volumes: Sequence[k8s.core.v1.VolumeArgs]
    shared_mounts: Sequence[k8s.core.v1.VolumeMountArgs]
    annotations: dict[str, str]  # on the Deployment and the Service (e.g. skipAwait)
    user: ClusterUser
    tolerations: list[k8s.core.v1.TolerationArgs]
    node_selector: dict[str, str] = field(default_factory=dict)
    # a LoadBalancer's loadBalancerSourceRanges: who may reach SSH (the policy pack refuses none)
    source_ranges: Sequence[str] = ()
    # why the login may be open to the world anyway (the policy pack's waiver annotation)
    policy_waiver: str | None = None


class SlurmLogin(SubComponent):
    service: k8s.core.v1.Service
    host_key: pulumi.Output[str]  # the public key, for users' known_hosts

    def __init__(
        self, name: str, owner: str, args: SlurmLoginArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:slurm:SlurmLogin", name, owner, opts)
        self.labels = base_labels("slurm-login", "login")
        host_key = self._host_key(args)
        keys = k8s.core.v1.ConfigMap(
            f"{owner}-login-keys",
            metadata=k8sargs.meta(
                "slurm-login-keys", args.namespace, base_labels("slurm-login-keys", "login")
            ),
            data={"authorized_keys": "".join(f"{k.strip()}\n" for k in args.authorized_keys)},
            opts=self.adopt(),
        )
        self._deployment(args, host_key.metadata.name, keys.metadata.name)
        annotations = dict(args.annotations)
        if args.policy_waiver:
            annotations[lb.POLICY_WAIVER_ANNOTATION] = args.policy_waiver
        load_balancer = args.service_type == "LoadBalancer"
        self.service = k8s.core.v1.Service(
            f"{owner}-login",
            metadata=k8sargs.meta("slurm-login", args.namespace, self.labels, annotations),
            spec=k8s.core.v1.ServiceSpecArgs(
                type=args.service_type,
                selector=self.labels,
                ports=[k8s.core.v1.ServicePortArgs(name="ssh", port=SSH_PORT, target_port=SSH_PORT)],
                load_balancer_source_ranges=list(args.source_ranges)
                if load_balancer and args.source_ranges
                else None,
            ),
            opts=self.adopt(),
        )
        self.register_outputs({"service": self.service.metadata.name, "hostKey": self.host_key})

    def _host_key(self, args: SlurmLoginArgs) -> k8s.core.v1.Secret:
        key = SshHostKey(
            f"{self.owner}-login-hostkey", comment=f"{args.cluster_name}-login", opts=self.adopt()
        )
        self.host_key = key.public_key
        return k8s.core.v1.Secret(
            f"{self.owner}-login-hostkey",
            metadata=k8sargs.meta(
                "slurm-login-hostkey", args.namespace, base_labels("slurm-login-hostkey", "login")
            ),
            type="Opaque",
            string_data={HOST_KEY_FILE: key.private_key, f"{HOST_KEY_FILE}.pub": key.public_key},
            opts=self.adopt(),
        )

    def _deployment(
        self, args: SlurmLoginArgs, host_key: pulumi.Input[str], keys: pulumi.Input[str]
    ) -> k8s.apps.v1.Deployment:
        pod = k8s.core.v1.PodSpecArgs(
            tolerations=args.tolerations,
            node_selector=args.node_selector or None,
            init_containers=[args.parts.munge_init, args.parts.munge],
            containers=[_sshd(args)],
            volumes=[
                *args.parts.volumes,
                *args.shared_volumes,
                k8sargs.secret_volume("host-key", host_key),
                k8sargs.config_map_volume("authorized-keys", keys, mode=0o444),
            ],
        )
        rollout = {lb.CONFIG_HASH_ANNOTATION: content_hash(args.parts.config_data, args.authorized_keys)}
        return k8s.apps.v1.Deployment(
            f"{self.owner}-login",
            metadata=k8sargs.meta("slurm-login", args.namespace, self.labels, args.annotations),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                selector=k8sargs.selector(self.labels),
                template=k8sargs.template(self.labels, pod, rollout),
            ),
            opts=self.adopt(),
        )


def _sshd(args: SlurmLoginArgs) -> k8s.core.v1.ContainerArgs:
    return k8s.core.v1.ContainerArgs(
        name="sshd",
        image=args.image,
        command=scripts.script(
            scripts.ensure_user(args.user),
            scripts.owned_dirs(args.user.name, f"/home/{args.user.name}"),
            "install -d -m 0755 /run/sshd",  # sshd's privilege separation directory
            " ".join(_sshd_argv()),
        ),
        env=[k8sargs.env("SLURM_CONF", f"{CONFIG_DIR}/slurm.conf")],
        ports=[k8s.core.v1.ContainerPortArgs(name="ssh", container_port=SSH_PORT)],
        volume_mounts=[
            *args.parts.mounts,
            *args.shared_mounts,
            k8sargs.mount("authorized-keys", AUTHORIZED_KEYS_DIR, read_only=True),
            k8sargs.mount("host-key", HOST_KEY_DIR, read_only=True),
        ],
        readiness_probe=k8sargs.tcp_probe(SSH_PORT, 1, 3),
        liveness_probe=k8sargs.tcp_probe(SSH_PORT, 30, 20),
    )


def _sshd_argv() -> list[str]:
    options = {
        "AuthorizedKeysFile": f"{AUTHORIZED_KEYS_DIR}/authorized_keys",
        # the keys file is a ConfigMap file (a symlink in a root-owned, kubelet-made directory)
        "StrictModes": "no",
        "UsePAM": "no",
        "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no",
        "PermitRootLogin": "no",
    }
    argv = ["exec", "/usr/sbin/sshd", "-D", "-e", "-h", f"{HOST_KEY_DIR}/{HOST_KEY_FILE}"]
    return argv + [f"-o{k}={v}" for k, v in options.items()]
