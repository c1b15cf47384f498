"""The images autoheal runs, as data: which Debian packages, what runs, how each proves it works.

Every image is built from Debian packages of one suite; none starts from a base image pulled from a
registry (none is reachable here, and a user's build should not depend on one either). trixie is
the suite because it ships Slurm 24.11; the runner must speak the same Slurm protocol as the
controller, so it takes its Slurm client from the same suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from images.oci import RuntimeConfig

REPOSITORY = "localhost/autoheal"  # fully qualified: CRI would look a short name up on docker.io
SUITE = "trixie"
PYTHON = "3.13"  # trixie's python3; the runner's wheels are fetched for it
RECIPE_REV = "1"  # bump to rebuild every image (a change of build logic, not of inputs)
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    packages: tuple[str, ...]
    runtime: RuntimeConfig
    # a shell command, run in a container of the image, that exits 0 only if the image works
    check: str
    variant: str = "essential"
    hooks: tuple[str, ...] = ()
    suite: str = SUITE
    # the project goes on top in its own layer (the runner)
    project_layer: bool = False
    extra_inputs: dict[str, str] = field(default_factory=dict)

    @property
    def repository(self) -> str:
        return f"{REPOSITORY}/{self.name}"


PAUSE = Recipe(
    name="pause",
    description="the pod sandbox: catatonit in pause mode (static, 0.7 MB)",
    packages=("catatonit",),
    variant="extract",  # only the package's files: no shell, no libc, nothing to patch
    runtime=RuntimeConfig(entrypoint=["/usr/bin/catatonit", "-P"], env=[_PATH]),
    check="",  # every pod's sandbox is a pause container: a running pod is the check
)

# Packages install a munge key and ssh host keys; an image must not carry secrets every copy
# shares. The key comes from a Secret and host keys are made at start (ssh-keygen -A).
_NO_SECRETS = 'rm -f "$1"/etc/munge/munge.key "$1"/etc/ssh/ssh_host_*'

SLURM = Recipe(
    name="slurm",
    description="Slurm 24.11 (slurmctld, slurmd, client), munge and sshd: controller, login and GPU nodes",
    # curl + jq: a slurmd reads its own Node (a hot spare registers drained; components/slurm/workers.py)
    packages=(
        "slurmd",
        "slurmctld",
        "slurm-client",
        "munge",
        "openssh-server",
        "procps",
        "iproute2",
        "curl",
        "jq",
        "ca-certificates",
    ),
    runtime=RuntimeConfig(cmd=["/bin/bash"], env=[_PATH]),
    hooks=(_NO_SECRETS, 'chroot "$1" slurmd -V'),
    check=(
        "slurmd -V && mkdir -p /run/munge && mungekey -c -k /run/munge/k && "
        "(munged -F --key-file=/run/munge/k -S /run/munge/s --pid-file=/run/munge/p "
        "--seed-file=/run/munge/r &) && "
        "for i in $(seq 50); do [ -S /run/munge/s ] && break; sleep 0.1; done && "
        "munge -n -S /run/munge/s | unmunge -S /run/munge/s"
    ),
)

RUNNER = Recipe(
    name="runner",
    description="the remediation runner: autoheal, ansible-core + collections, playbooks, roles, "
    "Slurm client, munge",
    packages=("python3", "python3-venv", "slurm-client", "munge", "openssh-client", "ca-certificates"),
    runtime=RuntimeConfig(
        entrypoint=["/opt/autoheal/bin/autoheal"],
        cmd=["serve"],
        env=["PATH=/opt/autoheal/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        working_dir="/opt/autoheal/share/autoheal",
    ),
    project_layer=True,
    check="autoheal --version",
)

RECIPES: dict[str, Recipe] = {r.name: r for r in (PAUSE, SLURM, RUNNER)}
