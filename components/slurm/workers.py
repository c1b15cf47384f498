"""SlurmWorkers: one slurmd DaemonSet per GPU pool, on that pool's nodes with all their GPUs.

Slurm node identity follows the Kubernetes node whatever its name: slurmd starts as a *dynamic
node* (`slurmd -Z -N $(NODE_NAME) --conf "<the pool's CPUs, GRES, feature>"`), as Slinky's
slurm-operator does, instead of a fixed `NodeName=prefix-[1-N]` list in slurm.conf. Why: cloud
nodes are named like `ip-10-0-3-17.ec2.internal` and a replacement gets a new name, which a static
list can neither predict nor resolve; a dynamic node registers with slurmctld from wherever its
pod runs (slurmctld keeps the address it registered from), joins its pool's partition through the
`pool_<name>` feature (a NodeSet), and is deleted from Slurm when its pod stops
(`scontrol delete nodename`), so a retired node leaves. soperator's alternative, a StatefulSet
whose pod names are the Slurm names, would break the runbook's one name for a node.

The pods run on the pod network (as in Slinky): each has its own hostname and address, which is
what `srun hostname` and Slurm's node-to-node traffic see. They are pinned to the pool's label,
tolerate the pool's taints and the hot-spare taint (spares run slurmd too), and request every GPU
of the node; each pool's gres.conf names the device files the GPU device plugin puts in the pod.
The update strategy is `OnDelete`, so a config change never restarts slurmd under a running
training job. The pod template carries the hash of the files this pool's slurmd reads (slurm.conf,
cgroup.conf, its gres.conf), so a pool change (a new pool, a pool's GPUs, features or Gres, any
slurm.conf change) is a template change `pulumi up` applies; the pods already running then sit on
an old revision until playbooks/slurm_rollout.yml restarts them one node at a time, each drained
first and restarted only once its jobs are done (docs/runbook.md). A restart, not
`scontrol reconfigure`: a dynamic node's CPUs, Gres and features are the `--conf` slurmd registers
with (slurmd(8), `--conf`, used with `-Z`), which only a new registration changes; slurm.conf(5)
names parameters (GresTypes, TaskPlugin...) that need slurmd restarted; and reconfigure restarts
no daemon (scontrol(1), `reconfigure`). The pod is Ready once slurmctld knows its node
(`scontrol show node`).

Jobs run inside the pod with only the GPUs Slurm gave them: slurmd confines each step in a cgroup
of its own below the pod's (task/cgroup, ConstrainDevices: the other GPUs' device files answer
EPERM). Writing cgroups needs a read-write cgroup mount, which Kubernetes gives only a privileged
container, as Slinky's slurmd runs; the pod still sees only the GPUs the device plugin gave it.

A node joins as what Kubernetes says it is: on a hot spare (the node carries the spare taint,
which the pool's controller puts on new capacity) slurmd registers DRAINED with the spare reason
autoheal owns, so the node takes work only through a promotion, and a replacement that a cloud
brings joins the spare set by itself. slurmd reads its node with its own ServiceAccount, which may
`get` nodes and nothing else.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb
from autoheal.slurmconf import dynamic_node_conf
from components import k8sargs
from components.common import SubComponent, base_labels, child, content_hash
from components.nodepool import PoolPlacement
from components.slurm import scripts
from components.slurm.config import CONFIG_VOLUME, SlurmPodParts, pool_gres_key
from components.slurm.layout import CONFIG_DIR, RUN_DIR, SLURMD_PORT, SPOOL_DIR
from components.slurm.scripts import ClusterUser


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
    user: ClusterUser
    service_account: pulumi.Input[str]  # may get nodes: a spare registers drained


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
            metadata=k8sargs.meta(f"slurmd-{pool}", args.namespace, labels, _await(args)),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8sargs.selector(labels),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(type="OnDelete"),
                template=k8sargs.template(
                    labels, _pod(args), {lb.CONFIG_HASH_ANNOTATION: pool_config_hash(args.parts, pool)}
                ),
            ),
            opts=self.adopt(),
        )
        self.register_outputs({"daemonSet": self.daemon_set.metadata.name, "pool": pool})


def pool_config_hash(parts: SlurmPodParts, pool: str) -> str:
    """The hash of what this pool's slurmd reads: another pool's gres.conf rolls only that pool."""
    data = parts.config_data
    return content_hash({k: data[k] for k in ("slurm.conf", "cgroup.conf", pool_gres_key(pool))})


# The munge containers of a Guaranteed slurmd pod: every container, init ones too, must request
# what it is limited to. munged and the key copy need a few MiB.
MUNGE_RESOURCES = {"cpu": "50m", "memory": "64Mi"}


def slurmd_resources(args: SlurmWorkersArgs) -> dict[str, str]:
    """What slurmd requests and is limited to: every GPU of its node and, for a Guaranteed pool,
    the CPUs and memory Slurm is told the node has (CPUs=, RealMemory= in MiB)."""
    pool = args.placement.pool
    out = {lb.GPU_RESOURCE: str(pool.gpus_per_node)}
    if args.placement.guaranteed:
        out.update(cpu=str(pool.cpus), memory=f"{pool.real_memory_mb}Mi")
    return out


def _sized(container: k8s.core.v1.ContainerArgs, resources: dict[str, str]) -> k8s.core.v1.ContainerArgs:
    sized = copy.copy(container)  # the shared part stays as it is for slurmctld and login
    sized.resources = k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources)
    return sized


def _pod(args: SlurmWorkersArgs) -> k8s.core.v1.PodSpecArgs:
    placement = args.placement
    parts = args.parts
    munge = [parts.munge_init, parts.munge]
    if placement.guaranteed:
        munge = [_sized(c, MUNGE_RESOURCES) for c in munge]
    return k8s.core.v1.PodSpecArgs(
        # slurmd gets the job's grace period (KillWait) and some time to report back.
        termination_grace_period_seconds=args.grace_seconds + 30,
        service_account_name=args.service_account,
        # off a node while the recovery ladder resets or validates its GPUs (slurmd holds their
        # allocation): roles/ladder/tasks/holders.yml; and off a node lent to inference
        # (remediation/lender.py), whose GPUs then go to the inference pods
        affinity=k8sargs.required_node_affinity(
            [k8sargs.node_has(k, v) for k, v in sorted(placement.selector.items())]
            + [k8sargs.gpu_agents_running(), k8sargs.not_lent()]
        ),
        tolerations=placement.tolerations(),
        init_containers=munge,
        containers=[_slurmd(args)],
        volumes=[
            parts.pool_config_volume(placement.pool.name),
            *[v for v in parts.volumes if v.name != CONFIG_VOLUME],
            *args.shared_volumes,
            k8sargs.empty_dir("spool"),
        ],
    )


def _await(args: SlurmWorkersArgs) -> dict[str, str]:
    """What `pulumi up` waits for: every node the pool starts with (actives and spares) running a
    Ready slurmd. Not the provider's own DaemonSet await: with `OnDelete` no pod is ever updated
    in place, so after a template change it would wait for an update that never comes (measured:
    `pulumi up` hung until its timeout)."""
    if args.annotations:  # skipAwait: a lab without kubelets
        return args.annotations
    pool = args.placement.pool
    return {"pulumi.com/waitFor": f"jsonpath={{.status.numberReady}}={pool.size + pool.spares}"}


# On SIGTERM (pod deletion, drain, eviction): stop slurmd, then take the node out of Slurm, so a
# retired Kubernetes node leaves Slurm rather than lingering DOWN. Slurm refuses to delete a node
# that still has a job: then it stays, DOWN, for the runbook to see.
_RUN_SLURMD = """[ "$SPARE" = 0 ] || NODE_CONF="$NODE_CONF State=DRAIN Reason=\\"{reason}\\""
set +e
slurmd -D -Z -N "$NODE_NAME" --conf "$NODE_CONF" -f {conf} &
pid=$!
trap 'kill -TERM $pid; wait $pid; scontrol delete nodename="$NODE_NAME"; exit 0' TERM
wait $pid
exit $?"""


def _slurmd(args: SlurmWorkersArgs) -> k8s.core.v1.ContainerArgs:
    resources = slurmd_resources(args)
    # Ready: slurmctld knows the node and hears from its slurmd (not NOT_RESPONDING, which a node
    # record kept across a reboot shows until this slurmd has registered)
    known = k8s.core.v1.ProbeArgs(
        exec_=k8s.core.v1.ExecActionArgs(
            command=[
                "sh",
                "-c",
                'out=$(scontrol show node "$NODE_NAME") && ! echo "$out" | grep -q NOT_RESPONDING',
            ]
        ),
        period_seconds=5,
        timeout_seconds=5,
        failure_threshold=3,
    )
    # Alive: slurmctld has a record of the node. A dynamic node's slurmd (-Z) refused at start (no
    # MaxNodeCount slot while a dead node's record held it) retries on a delay doubling to 128 s,
    # at debug level, and was seen still unregistered 240 s after the slot came free; restarting it
    # registers it anew. Only Slurm's own answer for an unknown node counts (24.11's scontrol says
    # "Node %s not found", or "Invalid node name specified" from a single-node load): a slurmctld
    # that cannot be reached
    # restarts nothing, and a node Slurm does not know runs no job a restart could kill.
    registered = k8s.core.v1.ProbeArgs(
        exec_=k8s.core.v1.ExecActionArgs(
            command=[
                "sh",
                "-c",
                '! scontrol show node "$NODE_NAME" 2>&1 | grep -qE "not found|Invalid node name"',
            ]
        ),
        initial_delay_seconds=30,
        period_seconds=10,
        timeout_seconds=5,
        failure_threshold=6,
    )
    return k8s.core.v1.ContainerArgs(
        name="slurmd",
        image=args.image,
        command=scripts.script(
            scripts.ensure_user(args.user),
            f"install -d {RUN_DIR}",
            scripts.wait_for_munge(),
            scripts.read_spare(lb.SPARE_TAINT_KEY),
            _RUN_SLURMD.format(conf=f"{CONFIG_DIR}/slurm.conf", reason=lb.SPARE_REASON),
        ),
        env=[
            k8sargs.field_env("NODE_NAME", "spec.nodeName"),
            k8sargs.env("NODE_CONF", dynamic_node_conf(args.placement.pool)),
        ],
        ports=[k8s.core.v1.ContainerPortArgs(name="slurmd", container_port=SLURMD_PORT)],
        resources=k8s.core.v1.ResourceRequirementsArgs(requests=resources, limits=resources),
        volume_mounts=[*args.parts.mounts, *args.shared_mounts, k8sargs.mount("spool", SPOOL_DIR)],
        # no TCP liveness probe (slurmd logs each empty connection): the container ends with slurmd
        readiness_probe=known,
        liveness_probe=registered,
        # a read-write cgroup mount, for the jobs' cgroups (the module's docstring)
        security_context=k8s.core.v1.SecurityContextArgs(privileged=True),
    )


# slurmd's identity: it reads its own Node (the spare taint) and nothing else
SLURMD_NODE_RULES = ((("",), ("nodes",), ("get",)),)


def slurmd_identity(parent: pulumi.Resource, owner: str, namespace: pulumi.Input[str]) -> pulumi.Output[str]:
    """The slurmd pods' ServiceAccount, allowed to get nodes (cluster-wide: Nodes have no
    namespace) and nothing more; returns its name."""
    labels = base_labels("slurmd", "slurmd")
    sa = k8s.core.v1.ServiceAccount(
        f"{owner}-slurmd-sa", metadata=k8sargs.meta("slurmd", namespace, labels), opts=child(parent)
    )
    role = k8s.rbac.v1.ClusterRole(
        f"{owner}-slurmd-role",
        metadata=k8sargs.meta("autoheal-slurmd", None, labels),
        rules=[
            k8s.rbac.v1.PolicyRuleArgs(api_groups=list(g), resources=list(r), verbs=list(v))
            for g, r, v in SLURMD_NODE_RULES
        ],
        opts=child(parent),
    )
    k8s.rbac.v1.ClusterRoleBinding(
        f"{owner}-slurmd-binding",
        metadata=k8sargs.meta("autoheal-slurmd", None, labels),
        role_ref=k8s.rbac.v1.RoleRefArgs(
            api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role.metadata.name
        ),
        subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sa.metadata.name, namespace=namespace)],
        opts=child(parent),
    )
    return sa.metadata.name
