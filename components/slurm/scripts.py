"""The shell each Slurm pod runs before its daemon: small, POSIX sh, and tested in real pods.

Kept here rather than baked into the image so that a change of start-up logic is a pod template
change Pulumi shows, not an image rebuild; the image (images/recipes.py SLURM) only has to carry
Debian's packages.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from components.slurm.layout import MUNGE_DIR, MUNGE_KEY_DIR, MUNGE_SOCKET_DIR


@dataclass(frozen=True)
class ClusterUser:
    """The account researchers log in as. The same name and ids in every Slurm pod: slurmctld
    resolves the submitting uid and slurmd runs the job's processes as it."""

    name: str = "researcher"
    uid: int = 1000
    gid: int = 1000


def munge_init() -> str:
    """munged refuses a key that is a symlink (a Secret volume's file is one) or readable by
    anyone but its owner, and a socket directory others may write (an emptyDir is 0777): copy
    the key into a directory of munge's own and tighten the socket directory."""
    return (
        f"install -d -o munge -g munge -m 0700 {MUNGE_DIR} && "
        f"install -o munge -g munge -m 0400 {MUNGE_KEY_DIR}/munge.key {MUNGE_DIR}/munge.key && "
        f"install -d -o munge -g munge -m 0755 {MUNGE_SOCKET_DIR}"
    )


def munged() -> list[str]:
    """munged as the munge user (never root), logging to the container's stderr."""
    return ["runuser", "-u", "munge", "--", "munged", "--foreground", f"--key-file={MUNGE_DIR}/munge.key"]


def owned_dirs(owner: str, *dirs: str) -> str:
    """Directories the daemon writes after dropping to `owner` (a fresh volume is root's)."""
    return f"install -d -o {owner} -g {owner} -m 0755 {' '.join(shlex.quote(d) for d in dirs)}"


def ensure_user(user: ClusterUser) -> str:
    """Create the cluster's user in this container (each container has its own /etc/passwd).
    Password '*': no password login, but not 'locked', which sshd would refuse even for keys."""
    return (
        f"getent group {user.gid} >/dev/null || groupadd -g {user.gid} {user.name}; "
        f"getent passwd {user.uid} >/dev/null || useradd -u {user.uid} -g {user.gid} -M "
        f"-d /home/{user.name} -s /bin/bash -p '*' {user.name}"
    )


def wait_for_munge() -> str:
    """Slurm commands fail at once without munged's socket; the sidecar starts beside us."""
    return f"for i in $(seq 100); do [ -S {MUNGE_SOCKET_DIR}/munge.socket.2 ] && break; sleep 0.1; done"


def script(*steps: str) -> list[str]:
    """`sh -ec` of the steps; the last one should `exec` the daemon so it gets the signals."""
    return ["sh", "-ec", "\n".join(steps)]


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def read_spare(taint_key: str) -> str:
    """Set SPARE to how many `taint_key` taints this pod's Kubernetes node carries (1 on a hot
    spare, else 0), read from the API server with the pod's ServiceAccount (nodes: get). A node
    that cannot be read stops the container (`sh -e`) with curl's error: registering without
    knowing would put work on a spare, or keep an active node from taking any."""
    url = "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/nodes/$NODE_NAME"
    query = f'[.spec.taints[]? | select(.key == "{taint_key}")] | length'
    return (
        f"node_json=$(curl -sSf --max-time 10 --retry 5 --retry-all-errors --cacert {SA_DIR}/ca.crt "
        f'-H "Authorization: Bearer $(cat {SA_DIR}/token)" "{url}")\n'
        f"SPARE=$(printf '%s' \"$node_json\" | jq -r {shlex.quote(query)})"
    )
