"""RemediationRunner: the webhook receiver that turns alerts into Ansible runs, and its identity.

It declares the runner's Deployment and Service, a ServiceAccount with exactly what the XID runbook
and the cordon sync do to a cluster, and nothing more. Cluster-wide (ClusterRole), because a failed
node's pods live in any namespace:

    nodes            get, list, watch, patch  (read, cordon, taint, label, promote a spare; the
                                               cordon sync watches nodes cordoned by hand)
    pods             get, list                (opt-out labels, drain: kubernetes.core.k8s_drain
                                               lists the node's pods, then GETs each until gone)
    pods/eviction    create                   (drain through the Eviction API, PDB-aware)

The lender (settings `lending`, remediation/lender.py) needs nothing more: it labels, annotates and
cordons nodes (nodes patch), lists the inference pods (pods list), evicts them from a node it takes
back (pods/eviction), and writes its Events in the event namespace (the events Role below).
With `spare_keeper`, in the runner's namespace only (Role): configmaps get, list (the pools'
descriptions the leader's spare keeper reads; it marks spares with the nodes patch above).
In the runner's namespace only (Role `autoheal-runner-ladder-jobs`): jobs get, create, delete and
pods/log get - the recovery ladder's GPU reset and DCGM validation Jobs (autoheal.cluster.node_job
reads each Job by name, its pods through the pods list above, and the pod's log; the Jobs run
there: ladder_dcgm_namespace). The GPU agents are stopped through a node label (nodes patch).
In the audit namespace only (Role): events get, list, create (the audit role lists the Events
autoheal already wrote, so a rerun creates none twice, and creates the missing ones). Nothing
else: no secrets, no pod create/delete/exec, no node create/delete (the replacement backend
retires nodes with its own cloud identity). tests/k8s_runner proves it on a real API server.
No wildcard verbs, resources or API groups (the policy pack rejects them anywhere in the stack).
The webhook's bearer token is generated (components.secrets.RandomSecret) into a Secret
(`autoheal-runner-token`, key `token`): the runner reads it from a mounted file, Alertmanager
gets a reference to the same Secret, and the token itself is never in stack config. The routing
rules ship as a ConfigMap; the playbooks (with the vars/, specs/ and tasks/ they include), roles
and the in-repo collection come from the runner image, so they always match (the entry
playbooks' hash on the pod template still rolls the runner when they change). The incident
journal (SQLite) lives on a PersistentVolumeClaim, because nothing is acknowledged to
Alertmanager before it is on disk; that makes one replica. With `journal="postgres"` the journal
is a shared PostgreSQL database instead (its password from a Secret, as PGPASSWORD), the runner
runs `replicas` pods with leader election on a Lease in its namespace (Role: leases get, create,
update; remediation/leader.py), a PodDisruptionBudget keeps one up, and a rolling update hands the
Lease over: every replica answers the webhook, the leader alone runs plays. In its pod the runner
uses its ServiceAccount's token (in_cluster), reaches slurmctld through a munge sidecar
(components/runner_pod.py, which says why), checks both on /readyz, and runs the cordon sync.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from autoheal import __version__
from autoheal import labels as lb
from autoheal.journalrules import JournalKind, postgres_url_problem, replicas_problem
from components import k8sargs
from components.common import SecretRef, Taint, await_annotations, base_labels, child, content_hash
from components.runner_pod import (
    DATA_ROOT,
    RUN_AS,
    SLURM_DIR,
    RunnerPodArgs,
    RunnerResources,
    RunnerSlurmArgs,
    munge_containers,
    pod_security,
    runner_container,
    slurm_volumes,
)
from components.secrets import RandomSecret

RUNNER_NAME = "autoheal-runner"
TOKEN_SECRET_NAME = "autoheal-runner-token"  # noqa: S105 (a name, not a secret)
TOKEN_KEY = "token"  # noqa: S105 (a name, not a secret)
TOKEN_DIR = "/var/run/secrets/autoheal"  # noqa: S105 (a name, not a secret)
JOURNAL_DIR = "/var/lib/autoheal"
CONFIG_DIR = "/etc/autoheal/config"
PLAYBOOK_DIR = f"{DATA_ROOT}/playbooks"  # from the image, with the vars/, specs/, tasks/ they include

Rule = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]  # (apiGroups, resources, verbs)
# The runbook's needs, spelled out; tests pin these exactly and replay them on a real API server.
RUNNER_RBAC_RULES: tuple[Rule, ...] = (
    (("",), ("nodes",), ("get", "list", "watch", "patch")),
    (("",), ("pods",), ("get", "list")),
    (("",), ("pods/eviction",), ("create",)),
    # the slurmd rollout (playbooks/slurm_rollout.yml): a pod is stale when its revision is not
    # its DaemonSet's newest ControllerRevision
    (("apps",), ("controllerrevisions",), ("list",)),
)
RUNNER_EVENT_RULES: tuple[Rule, ...] = ((("",), ("events",), ("get", "list", "create")),)
# leader election (journal="postgres"), in the runner's own namespace: the one Lease, read,
# created on first start, renewed (update); nothing else of coordination.k8s.io
RUNNER_LEASE_RULES: tuple[Rule, ...] = ((("coordination.k8s.io",), ("leases",), ("get", "create", "update")),)
# the spare keeper (spare_keeper=True), in the runner's own namespace: it lists the pool
# descriptions (ConfigMaps autoheal-pool-<name>); it marks nodes with the cluster-wide nodes patch
RUNNER_POOL_RULES: tuple[Rule, ...] = ((("",), ("configmaps",), ("get", "list")),)
# the recovery ladder's Jobs (reset, diagnostics, evidence), in the runner's own namespace: each
# read by name (no list), created, deleted when done; the log of its pod
RUNNER_LADDER_RULES: tuple[Rule, ...] = (
    (("batch",), ("jobs",), ("get", "create", "delete")),
    (("",), ("pods/log",), ("get",)),
)
# a pool whose backend is karpenter (pools/karpenter.py): its NodePools read, a retired node's
# NodeClaim deleted (Karpenter drains and terminates it and launches the replacement)
RUNNER_KARPENTER_RULES: tuple[Rule, ...] = (
    (("karpenter.sh",), ("nodepools",), ("get", "list")),
    (("karpenter.sh",), ("nodeclaims",), ("get", "list", "delete")),
)
LEASE_NAME = RUNNER_NAME


@dataclass(frozen=True)
class RunnerPostgresArgs:
    """A PostgreSQL journal shared by the replicas. `url` carries no password (libpq URL:
    postgresql://user@host:port/db?sslmode=verify-full); the password is a Secret's key."""

    url: str
    password: SecretRef | None = None

    def validate(self) -> None:
        problem = postgres_url_problem(self.url)
        if problem is not None:
            raise ValueError(problem)


def _policy_rules(rules: tuple[Rule, ...]) -> list[k8s.rbac.v1.PolicyRuleArgs]:
    return [
        k8s.rbac.v1.PolicyRuleArgs(api_groups=list(groups), resources=list(resources), verbs=list(verbs))
        for groups, resources, verbs in rules
    ]


@dataclass(frozen=True)
class RemediationRunnerArgs:
    namespace: pulumi.Input[str] = "autoheal"
    image: str = f"ghcr.io/autoheal/runner:{__version__}"
    port: int = 9095  # the runner listens here in its pod (its own default)
    service_port: int = 8080  # what Alertmanager calls: monitoring/alertmanager.yml ships this
    webhook_path: str = "/webhook"
    rules_yaml: str = "rules: []\n"
    playbooks: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    journal_size: str = "1Gi"
    journal_storage_class: str | None = None
    event_namespace: str = "default"  # where the audit role writes its Events (audit_event_namespace)
    service_type: str = "ClusterIP"
    node_port: int | None = None  # with service_type NodePort: the port on every node (None: any)
    token_bytes: int = 32
    wait_for_rollout: bool = True
    # the path to slurmctld (munge sidecar + slurm.conf); None: a runner without Slurm access
    slurm: RunnerSlurmArgs | None = None
    resources: RunnerResources = field(default_factory=RunnerResources)
    cordon_sync: bool = True  # Kubernetes cordons and taints by hand drain in Slurm
    # the leader keeps each pool's declared spares (remediation/spares.py); needs the pool
    # ConfigMaps in the runner's namespace
    spare_keeper: bool = False
    # the leader deletes dynamic Slurm nodes whose Node is gone (remediation/dead_nodes.py)
    dead_nodes: bool = False
    # taints the runner tolerates: none by default (it belongs on system nodes, not GPU nodes)
    tolerate: Sequence[Taint] = ()
    # labels a node must carry to run the runner (e.g. system nodes); none: any
    node_selector: Mapping[str, str] = field(default_factory=dict)
    # "sqlite": one replica, its journal on a PVC; "postgres": `replicas` pods sharing `postgres`
    journal: JournalKind = "sqlite"
    postgres: RunnerPostgresArgs | None = None
    replicas: int = 1
    # on the runner's ServiceAccount (EKS: `eks.amazonaws.com/role-arn`, its IAM role)
    service_account_annotations: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    # the cloud's settings for the pool backends the plays call (EKS: AWS_REGION and the
    # cluster whose instances `autoheal pool` may act on, AUTOHEAL_POOL_CLUSTER)
    cloud_env: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)

    def validate(self) -> None:
        problem = replicas_problem(self.journal, self.replicas)
        if problem is not None:
            raise ValueError(problem)
        if self.journal == "postgres":
            if self.postgres is None:
                raise ValueError("journal='postgres' needs postgres=RunnerPostgresArgs(url=...)")
            self.postgres.validate()
        if not self.webhook_path.startswith("/"):
            raise ValueError(f"webhook_path must start with '/', got {self.webhook_path!r}")
        if self.node_port is not None and self.service_type != "NodePort":
            raise ValueError(f"node_port needs service_type='NodePort', got {self.service_type!r}")
        if self.token_bytes < 16:
            raise ValueError(f"token_bytes must be at least 16, got {self.token_bytes}")
        for fname in self.playbooks:
            if "/" in fname or not fname.endswith((".yml", ".yaml")):
                raise ValueError(f"playbook {fname!r}: a file name ending in .yml or .yaml")


@dataclass(frozen=True)
class _RunnerFiles:
    """What the runner's pod mounts, by object name."""

    token_secret: pulumi.Input[str]
    config_map: pulumi.Input[str]
    journal_claim: pulumi.Input[str] | None  # None: the journal is PostgreSQL
    config_hash: str
    slurm: tuple[pulumi.Input[str], pulumi.Input[str]] | None  # (config map, munge key secret)


class RemediationRunner(pulumi.ComponentResource):
    """The runner: identity and RBAC, token, config, journal, workload, service (see above)."""

    webhook_url: pulumi.Output[str]
    token_secret: SecretRef
    service_account_name: pulumi.Output[str]
    cluster_role: k8s.rbac.v1.ClusterRole

    def __init__(
        self, name: str, args: RemediationRunnerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:runner:RemediationRunner", name, None, opts)
        args.validate()
        self._name, self._args = name, args
        self.labels = base_labels(RUNNER_NAME, lb.RUNNER_COMPONENT)
        skip = await_annotations(args.wait_for_rollout)
        self.service_account_name = self._identity()
        token = self._token()
        config_map, config_hash = self._config()
        journal = self._journal(skip) if args.journal == "sqlite" else None
        if args.journal == "postgres":
            self._leader_election()
        if _loop_on(args, "spare_keeper"):
            self._namespaced_role("pools", "pools", RUNNER_POOL_RULES)
        self._namespaced_role("ladder", "ladder-jobs", RUNNER_LADDER_RULES)
        files = _RunnerFiles(token, config_map, journal, config_hash, self._slurm())
        self._workload(files, skip)
        if args.replicas > 1:
            self._disruption_budget()
        self.webhook_url = self._service(skip)
        self.register_outputs(
            {
                "webhookUrl": self.webhook_url,
                "tokenSecret": self.token_secret.name,
                "serviceAccount": self.service_account_name,
            }
        )

    def _meta(
        self, obj: str, annotations: Mapping[str, pulumi.Input[str]] | None = None
    ) -> k8s.meta.v1.ObjectMetaArgs:
        return k8sargs.meta(obj, self._args.namespace, self.labels, annotations)

    def _backend_rules(self) -> tuple[Rule, ...]:
        """What the pools' backends need of the cluster (runner settings `pool_backends`)."""
        backends = set((self._args.settings.get("pool_backends") or {}).values())
        return RUNNER_KARPENTER_RULES if "karpenter" in backends else ()

    def _identity(self) -> pulumi.Output[str]:
        """A ServiceAccount with RUNNER_RBAC_RULES cluster-wide and RUNNER_EVENT_RULES in the
        event namespace, nothing more."""
        sa = k8s.core.v1.ServiceAccount(
            f"{self._name}-sa",
            metadata=self._meta(RUNNER_NAME, dict(self._args.service_account_annotations)),
            opts=child(self),
        )
        subjects = [
            k8s.rbac.v1.SubjectArgs(
                kind="ServiceAccount", name=sa.metadata.name, namespace=self._args.namespace
            )
        ]
        self.cluster_role = k8s.rbac.v1.ClusterRole(
            f"{self._name}-role",
            metadata=k8sargs.meta(RUNNER_NAME, None, self.labels),
            rules=_policy_rules(RUNNER_RBAC_RULES + self._backend_rules()),
            opts=child(self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{self._name}-binding",
            metadata=k8sargs.meta(RUNNER_NAME, None, self.labels),
            role_ref=_role_ref("ClusterRole", self.cluster_role.metadata.name),
            subjects=subjects,
            opts=child(self),
        )
        events = k8s.rbac.v1.Role(
            f"{self._name}-events-role",
            metadata=k8sargs.meta(f"{RUNNER_NAME}-events", self._args.event_namespace, self.labels),
            rules=_policy_rules(RUNNER_EVENT_RULES),
            opts=child(self),
        )
        k8s.rbac.v1.RoleBinding(
            f"{self._name}-events-binding",
            metadata=k8sargs.meta(f"{RUNNER_NAME}-events", self._args.event_namespace, self.labels),
            role_ref=_role_ref("Role", events.metadata.name),
            subjects=subjects,
            opts=child(self),
        )
        return sa.metadata.name

    def _leader_election(self) -> None:
        """The Lease's Role, in the runner's namespace (where the Lease lives)."""
        self._namespaced_role("lease", "leader-election", RUNNER_LEASE_RULES)

    def _namespaced_role(self, part: str, suffix: str, rules: tuple[Rule, ...]) -> None:
        """A Role of the runner's own namespace (`autoheal-runner-<suffix>`) with `rules`, bound
        to its ServiceAccount."""
        role = k8s.rbac.v1.Role(
            f"{self._name}-{part}-role",
            metadata=self._meta(f"{RUNNER_NAME}-{suffix}"),
            rules=_policy_rules(rules),
            opts=child(self),
        )
        k8s.rbac.v1.RoleBinding(
            f"{self._name}-{part}-binding",
            metadata=self._meta(f"{RUNNER_NAME}-{suffix}"),
            role_ref=_role_ref("Role", role.metadata.name),
            subjects=[
                k8s.rbac.v1.SubjectArgs(
                    kind="ServiceAccount", name=self.service_account_name, namespace=self._args.namespace
                )
            ],
            opts=child(self),
        )

    def _disruption_budget(self) -> None:
        """A drain of the runner's node (a node it may be healing) never takes the last replica."""
        k8s.policy.v1.PodDisruptionBudget(
            f"{self._name}-pdb",
            metadata=self._meta(RUNNER_NAME),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                min_available=1, selector=k8sargs.selector(self.labels)
            ),
            opts=child(self),
        )

    def _token(self) -> pulumi.Output[str]:
        """The webhook's bearer token, generated into a Secret the runner and Alertmanager share."""
        password = RandomSecret(f"{self._name}-token", length=self._args.token_bytes, opts=child(self))
        token = k8s.core.v1.Secret(
            f"{self._name}-token",
            metadata=self._meta(TOKEN_SECRET_NAME),
            type="Opaque",
            string_data={TOKEN_KEY: password.token},
            opts=child(self, additional_secret_outputs=["stringData", "data"]),
        )
        self.token_secret = SecretRef(name=token.metadata.name, key=TOKEN_KEY, namespace=self._args.namespace)
        return token.metadata.name

    def _config(self) -> tuple[pulumi.Output[str], str]:
        """The routing rules and runner.yaml as a ConfigMap. The playbooks come from the image;
        their text still goes into the hash on the pod template, so a change rolls the runner."""
        args = self._args
        data = {
            "rules.yaml": args.rules_yaml,
            "runner.yaml": yaml.safe_dump(runner_settings(args), sort_keys=True),
        }
        config = k8s.core.v1.ConfigMap(
            f"{self._name}-config", metadata=self._meta(f"{RUNNER_NAME}-config"), data=data, opts=child(self)
        )
        return config.metadata.name, content_hash(data, args.playbooks)

    def _slurm(self) -> tuple[pulumi.Output[str], pulumi.Output[str]] | None:
        """The cluster's Slurm configuration and munge key, copied into the runner's namespace
        (a pod mounts only its own namespace's ConfigMaps and Secrets)."""
        slurm = self._args.slurm
        if slurm is None:
            return None
        config = k8s.core.v1.ConfigMap(
            f"{self._name}-slurm",
            metadata=self._meta(f"{RUNNER_NAME}-slurm"),
            data=dict(slurm.config),
            opts=child(self),
        )
        key = k8s.core.v1.Secret(
            f"{self._name}-munge",
            metadata=self._meta(f"{RUNNER_NAME}-munge"),
            type="Opaque",
            data={"munge.key": slurm.munge_key_base64},
            opts=child(self, additional_secret_outputs=["data"]),
        )
        return config.metadata.name, key.metadata.name

    def _journal(self, skip: dict[str, str]) -> pulumi.Output[str]:
        """The incident journal's claim: nothing is acknowledged before it is on disk."""
        args = self._args
        journal = k8s.core.v1.PersistentVolumeClaim(
            f"{self._name}-journal",
            metadata=self._meta(f"{RUNNER_NAME}-journal", skip),
            spec=k8sargs.claim_spec("ReadWriteOnce", args.journal_size, args.journal_storage_class),
            opts=child(self),
        )
        return journal.metadata.name

    def _workload(self, files: _RunnerFiles, skip: dict[str, str]) -> k8s.apps.v1.Deployment:
        a = self._args
        volumes = [
            k8sargs.secret_volume("token", files.token_secret),
            k8sargs.config_map_volume("config", files.config_map),
            # with PostgreSQL the pod keeps only its play folders and node locks: its own emptyDir
            k8sargs.pvc_volume("journal", files.journal_claim)
            if files.journal_claim is not None
            else k8sargs.empty_dir("journal"),
            k8sargs.empty_dir("scratch"),
        ]
        if files.slurm is not None:
            volumes += slurm_volumes(*files.slurm)
        pod = k8s.core.v1.PodSpecArgs(
            service_account_name=self.service_account_name,
            automount_service_account_token=True,  # its identity: remediation/incluster.py
            security_context=pod_security(_pod_args(a).uid),
            init_containers=munge_containers(a.image) if files.slurm is not None else None,
            containers=[runner_container(_pod_args(a))],
            volumes=volumes,
            tolerations=[t.toleration() for t in a.tolerate] or None,
            node_selector=dict(a.node_selector) or None,
            affinity=_spread(self.labels) if a.replicas > 1 else None,
        )
        return k8s.apps.v1.Deployment(
            f"{self._name}-deployment",
            metadata=self._meta(RUNNER_NAME, {lb.STATE_DIR_ANNOTATION: JOURNAL_DIR, **skip}),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=a.replicas,
                strategy=_strategy(a),
                selector=k8sargs.selector(self.labels),
                template=k8sargs.template(self.labels, pod, {lb.CONFIG_HASH_ANNOTATION: files.config_hash}),
            ),
            opts=child(self),
        )

    def _service(self, skip: dict[str, str]) -> pulumi.Output[str]:
        """The Service Alertmanager calls; returns the webhook URL."""
        args = self._args
        service = k8s.core.v1.Service(
            f"{self._name}-service",
            metadata=self._meta(RUNNER_NAME, skip),
            spec=k8s.core.v1.ServiceSpecArgs(
                type=args.service_type,
                selector=self.labels,
                ports=[
                    k8s.core.v1.ServicePortArgs(
                        name="http", port=args.service_port, target_port="http", node_port=args.node_port
                    )
                ],
            ),
            opts=child(self),
        )
        return pulumi.Output.all(service.metadata.name, service.metadata.namespace).apply(
            lambda a: f"http://{a[0]}.{a[1]}.svc:{args.service_port}{args.webhook_path}"
        )


def _strategy(a: RemediationRunnerArgs) -> k8s.apps.v1.DeploymentStrategyArgs:
    """SQLite: Recreate (one writer of the file, never two pods on the claim). PostgreSQL: a
    rolling update that adds the new pod before it removes an old one; the Lease moves over."""
    if a.journal == "sqlite":
        return k8s.apps.v1.DeploymentStrategyArgs(type="Recreate")
    return k8s.apps.v1.DeploymentStrategyArgs(
        type="RollingUpdate",
        rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=1, max_unavailable=0),
    )


def _spread(labels: Mapping[str, str]) -> k8s.core.v1.AffinityArgs:
    """Replicas on different nodes where the cluster has them (preferred, so a small cluster still
    runs them all): one node's failure must not take the leader and its successor."""
    return k8s.core.v1.AffinityArgs(
        pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
            preferred_during_scheduling_ignored_during_execution=[
                k8s.core.v1.WeightedPodAffinityTermArgs(
                    weight=100,
                    pod_affinity_term=k8s.core.v1.PodAffinityTermArgs(
                        topology_key="kubernetes.io/hostname", label_selector=k8sargs.selector(labels)
                    ),
                )
            ]
        )
    )


def _role_ref(kind: str, name: pulumi.Input[str]) -> k8s.rbac.v1.RoleRefArgs:
    return k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind=kind, name=name)


def _loop_on(args: RemediationRunnerArgs, key: str) -> bool:
    """A leader's fleet loop is on by the component's flag or by the stack's runner settings."""
    return bool(getattr(args, key) or (args.settings.get(key) or {}).get("enabled"))


def runner_settings(args: RemediationRunnerArgs) -> dict[str, Any]:
    """The runner's own config file (remediation.config.RunnerConfig): the keys that describe this
    deployment's layout are set here; everything else passes through from `settings`."""
    play_vars = dict(args.settings.get("play_vars") or {})
    if args.slurm is not None:
        play_vars.setdefault("autoheal_slurm_conf", f"{SLURM_DIR}/slurm.conf")
    journal: dict[str, Any] = {"journal_path": f"{JOURNAL_DIR}/journal.sqlite"}
    if args.journal == "postgres" and args.postgres is not None:
        journal = {
            "journal_dsn": args.postgres.url,
            # namespace and identity come from the pod (POD_NAMESPACE, POD_NAME)
            "leader_election": {**dict(args.settings.get("leader_election") or {}), "enabled": True},
        }
    return {
        **args.settings,
        "listen_host": "0.0.0.0",  # noqa: S104 (inside the pod, behind the Service)
        "listen_port": args.port,
        "token_file": f"{TOKEN_DIR}/{TOKEN_KEY}",
        **journal,
        "state_dir": f"{JOURNAL_DIR}/state",
        "rules_file": f"{CONFIG_DIR}/rules.yaml",
        "playbook_dir": PLAYBOOK_DIR,
        "dry_run": args.dry_run,
        "in_cluster": True,  # the ServiceAccount's token, never a kubeconfig in a Secret
        "cluster_checks": True,  # /readyz: API server and slurmctld
        "cordon_sync": {**dict(args.settings.get("cordon_sync") or {}), "enabled": args.cordon_sync},
        "spare_keeper": {
            **dict(args.settings.get("spare_keeper") or {}),
            "enabled": _loop_on(args, "spare_keeper"),
        },
        "dead_nodes": {
            **dict(args.settings.get("dead_nodes") or {}),
            "enabled": _loop_on(args, "dead_nodes"),
        },
        # the lender's Events go where the runner may create Events (its events Role)
        "lending": {"event_namespace": args.event_namespace, **dict(args.settings.get("lending") or {})},
        "play_vars": play_vars,
    }


def _pod_args(args: RemediationRunnerArgs) -> RunnerPodArgs:
    return RunnerPodArgs(
        image=args.image,
        port=args.port,
        config_dir=CONFIG_DIR,
        token_dir=TOKEN_DIR,
        token_key=TOKEN_KEY,
        journal_dir=JOURNAL_DIR,
        dry_run=args.dry_run,
        slurm=args.slurm is not None,
        uid=args.slurm.uid if args.slurm is not None else RUN_AS,
        resources=args.resources,
        postgres_password=args.postgres.password if args.journal == "postgres" and args.postgres else None,
        cloud_env=args.cloud_env,
    )
