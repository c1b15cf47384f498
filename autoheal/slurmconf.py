"""One generator for slurm.conf and gres.conf, used by the local lab and the Pulumi SlurmCluster.

Both places must describe GPU pools to Slurm the same way (node names, GRES, partitions, which nodes
are hot spares), so the text is produced here from plain data and nowhere else. Spares are declared
DRAIN with a reason autoheal owns, so only a promotion (`state=resume`) puts work on them; capacity a
pool may grow into later (backfilled replacements) is declared FUTURE so slurmctld needs no restart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autoheal.labels import SPARE_REASON


@dataclass(frozen=True)
class SlurmPool:
    """A GPU node pool as Slurm sees it: `size` active nodes, `spares` drained hot spares, and
    `headroom` FUTURE nodes that replacements are provisioned into."""

    name: str
    prefix: str
    size: int
    spares: int = 0
    headroom: int = 0
    gpus_per_node: int = 8
    gpu_type: str = "h100"
    cpus: int = 2
    real_memory_mb: int = 1000
    # cloud-style names, `<prefix>-<i>.<domain>` (EKS: ip-10-0-3-17.us-west-2.compute.internal)
    domain: str = ""

    def node_names(self) -> list[str]:
        suffix = f".{self.domain}" if self.domain else ""
        return [f"{self.prefix}-{i}{suffix}" for i in range(1, self.size + self.spares + self.headroom + 1)]

    def active_nodes(self) -> list[str]:
        return self.node_names()[: self.size]

    def spare_nodes(self) -> list[str]:
        return self.node_names()[self.size : self.size + self.spares]

    def future_nodes(self) -> list[str]:
        return self.node_names()[self.size + self.spares :]


@dataclass(frozen=True)
class SlurmConfSpec:
    """Where things live. The lab fills in loopback addresses and per-node ports (many slurmd on one
    host); Kubernetes leaves `slurmd_port_base` unset so every slurmd uses the one SlurmdPort."""

    cluster_name: str
    controller_host: str
    controller_port: int
    pools: Sequence[SlurmPool]
    state_dir: str
    spool_dir: str
    log_dir: str
    run_dir: str
    gres_dev_dir: str = "/dev"
    slurmd_port_base: int | None = None
    node_addr: str | None = None
    auth_socket: str | None = None
    slurm_user: str = "root"
    grace_seconds: int = 120
    # Dynamic nodes (Kubernetes): no NodeName lines; each slurmd registers itself (`slurmd -Z`)
    # under its Kubernetes node's name, and pools are NodeSets by feature (see dynamic_node_conf).
    dynamic: bool = False
    # Jobs confined by cgroups (Kubernetes: slurmd pods): each step sees only the GPUs Slurm gave it
    # (ConstrainDevices) and its processes are tracked by cgroup. The host-process lab runs many
    # slurmd on one host, whose GPUs are all one device twin, so it tracks by process and confines
    # nothing.
    cgroups: bool = False
    extra: dict[str, str] = field(default_factory=dict)

    def all_nodes(self) -> list[str]:
        return [n for p in self.pools for n in p.node_names()]

    def slurmd_port(self, node: str) -> int | None:
        """Consecutive ports over all pools' nodes in order (so a run of nodes has a port range)."""
        if self.slurmd_port_base is None:
            return None
        return self.slurmd_port_base + self.all_nodes().index(node)


def render_slurm_conf(spec: SlurmConfSpec) -> str:
    if spec.dynamic:
        lines = [*_cluster_lines(spec), "", *_dynamic_lines(spec)]
    else:
        lines = [*_cluster_lines(spec), "", *_node_lines(spec), "", *_partition_lines(spec)]
    return "\n".join(lines) + "\n"


def _dynamic_lines(spec: SlurmConfSpec) -> list[str]:
    """Room for every node the pools may hold, and one NodeSet per pool found by its feature, so a
    node that registers with `Feature=pool_<name>` lands in its pool's partition by itself."""
    room = sum(len(p.node_names()) for p in spec.pools)
    # A dynamic slurmd hashes its slurm.conf with its own --conf line folded in, so slurmctld
    # reports every one as having "a different slurm.conf" although the file is the same
    # ConfigMap (measured): the check says nothing here.
    lines = [f"MaxNodeCount={room}", "DebugFlags=NO_CONF_HASH"]
    lines += [f"NodeSet=ns_{p.name} Feature=pool_{p.name}" for p in spec.pools]
    lines.append("PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    lines += [f"PartitionName={p.name} Nodes=ns_{p.name} MaxTime=INFINITE State=UP" for p in spec.pools]
    return lines


def dynamic_node_conf(pool: SlurmPool) -> str:
    """What a dynamic slurmd of `pool` declares about itself (`slurmd -Z --conf "..."`): the same
    CPUs, memory, GRES and feature a static NodeName line of the pool would give."""
    gres = f"Gres=gpu:{pool.gpu_type}:{pool.gpus_per_node}"
    return f"CPUs={pool.cpus} RealMemory={pool.real_memory_mb} {gres} Feature=pool_{pool.name}"


def render_pool_gres_conf(pool: SlurmPool, dev_dir: str = "/dev") -> str:
    """gres.conf for one pool's dynamic slurmd: no NodeName (its name is not known in advance),
    so each pool's slurmd reads a file of its own."""
    last = pool.gpus_per_node - 1
    return (
        "# Generated by autoheal.slurmconf\nAutoDetect=off\n"
        f"Name=gpu Type={pool.gpu_type} File={dev_dir}/nvidia[0-{last}]\n"
    )


# How soon a requeued job may start again (docs/operations.md, "Time to resume"). slurmctld holds
# a requeued job until its old credential has expired: begin time = requeue + cred_expire + 1 s,
# then the next scheduler pass. Measured on the lab (22.05, requeue -> RUNNING): cred_expire=10,
# sched_interval=2: 11.1 s; 5 and 2: 7.0 s; 5 and 1: 6.0-7.0 s. 5 is Slurm's floor: 22.05 rejects a
# smaller value ("AuthInfo=cred_expire=2 invalid") and silently runs with the 120 s default.
# The trade-off: a step launch that reaches its slurmd more than cred_expire after the credential
# was issued (a slow prolog, an overloaded or paged-out slurmd) is refused as expired; raise it
# where prologs are slow. sched_interval=1 runs the main scheduler every second (Slurm's default is
# 60 s; jobs ending or submitted also trigger it): a little slurmctld CPU for up to 1 s per restart.
CRED_EXPIRE_SECONDS = 5
SCHED_INTERVAL_SECONDS = 1


def _cluster_lines(spec: SlurmConfSpec) -> list[str]:
    """Controller, auth, paths, plugins and timers: the lab's measured settings."""
    auth_info = f"cred_expire={CRED_EXPIRE_SECONDS}"
    if spec.auth_socket:
        auth_info = f"socket={spec.auth_socket},cred_expire={CRED_EXPIRE_SECONDS}"
    lines = [
        "# Generated by autoheal.slurmconf: edit the pool definitions, not this file.",
        f"ClusterName={spec.cluster_name}",
        f"SlurmctldHost={spec.controller_host}",
        f"SlurmctldPort={spec.controller_port}",
        f"SlurmUser={spec.slurm_user}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo={auth_info}",
        f"StateSaveLocation={spec.state_dir}",
        f"SlurmdSpoolDir={_slurmd_spool(spec)}",
        f"SlurmctldPidFile={spec.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={spec.run_dir}/slurmd-%n.pid",
        f"SlurmctldLogFile={spec.log_dir}/slurmctld.log",
        f"SlurmdLogFile={spec.log_dir}/slurmd-%n.log",
        f"ProctrackType=proctrack/{'cgroup' if spec.cgroups else 'linuxproc'}",
        f"TaskPlugin=task/{'cgroup' if spec.cgroups else 'none'}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "GresTypes=gpu",
        "JobRequeue=1",
        "ReturnToService=1",
        "SlurmdParameters=config_overrides",
        f"SchedulerParameters=sched_interval={SCHED_INTERVAL_SECONDS},bf_interval=1",
        "MailProg=/bin/true",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        # A requeued job's processes get SIGTERM then, after KillWait, SIGKILL: KillWait is the
        # grace period Slurm itself gives when autoheal sets a node DOWN.
        f"KillWait={spec.grace_seconds}",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "MinJobAge=300",
        "Waittime=0",
    ]
    if spec.slurmd_port_base is None:  # one slurmd per host: the standard port
        lines.append("SlurmdPort=6818")
    return lines + [f"{k}={v}" for k, v in sorted(spec.extra.items())]


def _node_lines(spec: SlurmConfSpec) -> list[str]:
    lines: list[str] = []
    # One line per run of nodes (active, spares, headroom), as hostlist ranges with port ranges:
    # every Slurm command parses this file, and one line per node made each command of a
    # 2,000-node lab spend 0.12 s of CPU on it (measured; ~0 with ranges).
    for pool in spec.pools:
        base = dynamic_node_conf(pool)
        runs: tuple[tuple[list[str], list[str]], ...] = (
            (pool.active_nodes(), []),
            (pool.spare_nodes(), ["State=DRAIN", f'Reason="{SPARE_REASON}"']),
            (pool.future_nodes(), ["State=FUTURE"]),
        )
        for nodes, state in runs:
            if not nodes:
                continue
            parts = [f"NodeName={pool_range(pool, nodes)}"]
            if spec.node_addr:
                parts += [f"NodeHostname={spec.node_addr}", f"NodeAddr={spec.node_addr}"]
            first, last = spec.slurmd_port(nodes[0]), spec.slurmd_port(nodes[-1])
            if first is not None and last is not None:
                parts.append(f"Port={first}" if first == last else f"Port={first}-{last}")
            lines.append(" ".join([*parts, base, *state]))
    return lines


def _partition_lines(spec: SlurmConfSpec) -> list[str]:
    """`batch` (the default) holds every node; each pool is a partition of its own too."""
    every = ",".join(pool_range(p, p.node_names()) for p in spec.pools)
    lines = [f"PartitionName=batch Nodes={every} Default=YES MaxTime=INFINITE State=UP"]
    for pool in spec.pools:
        lines.append(
            f"PartitionName={pool.name} Nodes={pool_range(pool, pool.node_names())} MaxTime=INFINITE State=UP"
        )
    return lines


def _slurmd_spool(spec: SlurmConfSpec) -> str:
    """Each step's Unix socket is `<SlurmdSpoolDir>/<node>_<job>.<step>`, at most 108 bytes: with
    the node's name in the directory too, a cloud's name (ip-10-0-3-17.us-west-2.compute.internal)
    made it 115 and every job's launch failed (`Unix socket path ... is too long`, measured in the
    pods lab). A dynamic node's slurmd has a spool of its own (its pod's); the host lab runs many
    slurmd on one host, each in its own directory."""
    return spec.spool_dir if spec.dynamic else f"{spec.spool_dir}/slurmd-%n"


def pool_range(pool: SlurmPool, nodes: Sequence[str]) -> str:
    """A contiguous run of a pool's nodes as a Slurm hostlist: gpu-[5-9], or gpu-5 alone; dotted
    names (a domain) listed one by one, as Slurm ranges only a name's trailing number."""
    if pool.domain:
        return ",".join(nodes)
    first, last = nodes[0].rsplit("-", 1)[1], nodes[-1].rsplit("-", 1)[1]
    return nodes[0] if len(nodes) == 1 else f"{pool.prefix}-[{first}-{last}]"


def render_cgroup_conf() -> str:
    """cgroup.conf beside slurm.conf when `cgroups` is on: each job step may open only the GPU
    devices of its allocation (the others answer EPERM), whatever CUDA_VISIBLE_DEVICES says.

    `autodetect` picks cgroup v1 or v2 from what slurmd sees at /sys/fs/cgroup; in a container
    there is no systemd to ask for a scope, hence IgnoreSystemd (read by the v2 plugin only).
    Cores and memory are not constrained: the pod's own limits already bound them."""
    return (
        "# Generated by autoheal.slurmconf\n"
        "CgroupPlugin=autodetect\n"
        "IgnoreSystemd=yes\n"
        "ConstrainDevices=yes\n"
        "ConstrainCores=no\n"
        "ConstrainRAMSpace=no\n"
    )


def render_gres_conf(spec: SlurmConfSpec) -> str:
    """GPUs as device files: count-only GRES makes a node INVAL, so every GPU names a File."""
    lines = ["# Generated by autoheal.slurmconf", "AutoDetect=off"]
    # dynamic nodes: each pool's slurmd reads its own file (render_pool_gres_conf)
    for pool in [] if spec.dynamic else spec.pools:
        last = pool.gpus_per_node - 1
        lines.append(
            f"NodeName={pool_range(pool, pool.node_names())} Name=gpu Type={pool.gpu_type}"
            f" File={spec.gres_dev_dir}/nvidia[0-{last}]"
        )
    return "\n".join(lines) + "\n"


def range_names(text: str) -> list[str]:
    """The node names of one `pool_range` run: gpu-[5-9] -> gpu-5 ... gpu-9; a plain name -> itself."""
    head, sep, rest = text.partition("-[")
    if not sep or not rest.endswith("]"):
        return [text]
    first, _, last = rest[:-1].partition("-")
    return [f"{head}-{i}" for i in range(int(first), int(last) + 1)]
