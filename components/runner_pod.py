"""The runner's pod: the runner container, and the munged sidecar that gives it a path to slurmctld.

Why a munge sidecar with the cluster's key and the cluster's slurm.conf, not slurmrestd with a
JWT: the runbook speaks Slurm through its commands (scontrol, squeue, scancel in the collection's
modules), which authenticate with munge; a REST path would mean a second client for every Slurm
step and a JWT key to guard. Why slurm.conf from a ConfigMap, not configless (`--conf-server`):
client commands find a configless controller only through DNS SRV records or sackd, neither of
which a pod has; the same generator renders the file for slurmctld, so they cannot disagree.

The pod runs as uid 10001 with a read-only root filesystem, so everything written lives in
emptyDirs: Ansible's scratch and HOME (/tmp), munge's key copy and socket. munged refuses a key
that is a symlink (a Secret volume's file is one) and directories others may write (an emptyDir
is 0777): an init container copies the key into a 0700 directory of ours, and munged runs with
`--force`, which only turns those directory checks into warnings. The emptyDirs are the pod's own
(no other user on the node can reach them), which is what the checks protect against.
The sidecar is a native one (an init container that keeps running): its startup probe holds the
runner back until the socket exists, and it stops after the runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from components import k8sargs
from components.common import SecretRef

# the runner image's copy of the project: ansible.cfg, playbooks (with their vars/, specs/,
# tasks/), roles and the collection, as images/python.py installs them
DATA_ROOT = "/opt/autoheal/share/autoheal"
SCRATCH_DIR = "/tmp"  # an emptyDir of the pod's own
SLURM_DIR = "/etc/slurm"
MUNGE_SECRET_DIR = "/etc/munge-secret"  # noqa: S105 (a path, not a secret)
MUNGE_KEY_DIR = "/run/munge-key"
MUNGE_SOCKET_DIR = "/run/munge"  # Slurm's auth/munge and munge's clients look here by default
RUN_AS = 10001  # the runner without Slurm access: a uid of its own
# Debian's fixed uid of the `slurm` user (base-passwd), the same in the slurm and runner images
SLURM_USER_UID = 64030


@dataclass(frozen=True)
class RunnerSlurmArgs:
    """How the runner reaches slurmctld: the cluster's Slurm configuration files (slurm.conf and
    what it includes, as SlurmCluster renders them) and its munge key (base64, a secret)."""

    config: Mapping[str, pulumi.Input[str]]
    munge_key_base64: pulumi.Input[str]
    # The uid the runner runs as: the cluster's SlurmUser. Without slurmdbd (no AdminLevel for a
    # user of our own) only root and SlurmUser may drain, resume or requeue another user's work
    # ("Invalid user id" otherwise), and munge vouches for the caller's uid; SlurmUser, never root.
    uid: int = SLURM_USER_UID


@dataclass(frozen=True)
class RunnerResources:
    cpu_request: str = "250m"
    memory_request: str = "512Mi"
    cpu_limit: str = "2"  # a storm's plays run several ansible-playbook processes at once
    memory_limit: str = "2Gi"

    def args(self) -> k8s.core.v1.ResourceRequirementsArgs:
        return k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": self.cpu_request, "memory": self.memory_request},
            limits={"cpu": self.cpu_limit, "memory": self.memory_limit},
        )


@dataclass(frozen=True)
class RunnerPodArgs:
    image: str
    port: int
    config_dir: str
    token_dir: str
    token_key: str
    journal_dir: str
    dry_run: bool
    slurm: bool
    resources: RunnerResources = field(default_factory=RunnerResources)
    uid: int = RUN_AS  # RunnerSlurmArgs.uid with Slurm access
    postgres_password: SecretRef | None = None  # the PostgreSQL journal's password (PGPASSWORD)
    cloud_env: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # RemediationRunnerArgs


def _secure() -> k8s.core.v1.SecurityContextArgs:
    return k8s.core.v1.SecurityContextArgs(
        allow_privilege_escalation=False,
        read_only_root_filesystem=True,
        capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
    )


def _env(a: RunnerPodArgs) -> list[k8s.core.v1.EnvVarArgs]:
    env = [
        k8sargs.env("AUTOHEAL_TOKEN_FILE", f"{a.token_dir}/{a.token_key}"),
        k8sargs.env("AUTOHEAL_DRY_RUN", str(a.dry_run).lower()),
        k8sargs.env("ANSIBLE_CONFIG", f"{DATA_ROOT}/ansible.cfg"),
        k8sargs.env("HOME", SCRATCH_DIR),  # ansible-galaxy's and Ansible's per-user files
        # RUN_AS has no passwd entry in the image: Ansible asks getpass.getuser() at import,
        # which reads these before it looks the uid up (and fails: "No username set")
        k8sargs.env("USER", _user(a.uid)),
        k8sargs.env("LOGNAME", _user(a.uid)),
        k8sargs.env("ANSIBLE_LOCAL_TEMP", f"{SCRATCH_DIR}/ansible-tmp"),
        # the plays' "remote" is this pod: an absolute path, not ~USER (no home to expand to)
        k8sargs.env("ANSIBLE_REMOTE_TMP", f"{SCRATCH_DIR}/ansible-remote"),
        # background tasks' status files: ~ of a system user is its passwd home (/nonexistent)
        k8sargs.env("ANSIBLE_ASYNC_DIR", f"{SCRATCH_DIR}/ansible-async"),
        # leader election's identity and the Lease's namespace (remediation/leader.py)
        k8sargs.field_env("POD_NAME", "metadata.name"),
        k8sargs.field_env("POD_NAMESPACE", "metadata.namespace"),
    ]
    if a.postgres_password is not None:
        env.append(
            k8s.core.v1.EnvVarArgs(
                name="PGPASSWORD",
                value_from=k8s.core.v1.EnvVarSourceArgs(
                    secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(
                        name=a.postgres_password.name, key=a.postgres_password.key
                    )
                ),
            )
        )
    env += [k8s.core.v1.EnvVarArgs(name=k, value=v) for k, v in sorted(a.cloud_env.items())]
    return env


def runner_container(a: RunnerPodArgs) -> k8s.core.v1.ContainerArgs:
    mounts = [
        k8sargs.mount("token", a.token_dir, read_only=True),
        k8sargs.mount("config", a.config_dir, read_only=True),
        k8sargs.mount("journal", a.journal_dir),
        k8sargs.mount("scratch", SCRATCH_DIR),
    ]
    env = _env(a)
    if a.slurm:
        mounts += [
            k8sargs.mount("slurm-config", SLURM_DIR, read_only=True),
            k8sargs.mount("munge-socket", MUNGE_SOCKET_DIR),
        ]
        env.append(k8sargs.env("SLURM_CONF", f"{SLURM_DIR}/slurm.conf"))
    return k8s.core.v1.ContainerArgs(
        name="runner",
        image=a.image,
        command=["autoheal", "serve", "--config", f"{a.config_dir}/runner.yaml"],
        env=env,
        ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=a.port)],
        volume_mounts=mounts,
        resources=a.resources.args(),
        # /readyz names what the runner cannot reach (API server, slurmctld); its checks take up
        # to a few seconds, so the probe waits longer than the default second
        readiness_probe=k8s.core.v1.ProbeArgs(
            http_get=k8s.core.v1.HTTPGetActionArgs(path="/readyz", port="http"),
            period_seconds=10,
            timeout_seconds=15,
        ),
        liveness_probe=k8sargs.http_probe("/healthz", "http", period=20, initial=15),
        security_context=_secure(),
    )


def munge_containers(image: str) -> list[k8s.core.v1.ContainerArgs]:
    """The key copy (init) and munged (a native sidecar), both from the runner image."""
    key = f"{MUNGE_KEY_DIR}/k/munge.key"
    copy = k8s.core.v1.ContainerArgs(
        name="munge-key",
        image=image,
        command=[
            "sh",
            "-c",
            f"install -d -m 0700 {MUNGE_KEY_DIR}/k && install -m 0400 {MUNGE_SECRET_DIR}/munge.key {key}",
        ],
        volume_mounts=[
            k8sargs.mount("munge-secret", MUNGE_SECRET_DIR, read_only=True),
            k8sargs.mount("munge-key", MUNGE_KEY_DIR),
        ],
        security_context=_secure(),
    )
    munged = k8s.core.v1.ContainerArgs(
        name="munged",
        image=image,
        restart_policy="Always",  # a native sidecar
        command=[
            "munged",
            "--foreground",
            "--force",  # see the module docstring: the directories are the pod's own emptyDirs
            f"--key-file={key}",
            f"--seed-file={MUNGE_KEY_DIR}/k/munged.seed",
            f"--socket={MUNGE_SOCKET_DIR}/munge.socket.2",
            f"--pid-file={MUNGE_SOCKET_DIR}/munged.pid",
            "--log-file=/dev/stderr",
        ],
        volume_mounts=[
            k8sargs.mount("munge-key", MUNGE_KEY_DIR),
            k8sargs.mount("munge-socket", MUNGE_SOCKET_DIR),
        ],
        startup_probe=k8s.core.v1.ProbeArgs(
            exec_=k8s.core.v1.ExecActionArgs(command=["test", "-S", f"{MUNGE_SOCKET_DIR}/munge.socket.2"]),
            period_seconds=1,
            failure_threshold=30,
        ),
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={"cpu": "10m", "memory": "16Mi"}, limits={"cpu": "200m", "memory": "64Mi"}
        ),
        security_context=_secure(),
    )
    return [copy, munged]


def _user(uid: int) -> str:
    return "slurm" if uid == SLURM_USER_UID else "autoheal"


def pod_security(uid: int = RUN_AS) -> k8s.core.v1.PodSecurityContextArgs:
    return k8s.core.v1.PodSecurityContextArgs(
        run_as_non_root=True, run_as_user=uid, run_as_group=uid, fs_group=uid
    )


def slurm_volumes(
    config_map: pulumi.Input[str], munge_secret: pulumi.Input[str]
) -> list[k8s.core.v1.VolumeArgs]:
    return [
        k8sargs.config_map_volume("slurm-config", config_map),
        k8sargs.secret_volume("munge-secret", munge_secret),
        k8sargs.empty_dir("munge-key"),
        k8sargs.empty_dir("munge-socket"),
    ]
