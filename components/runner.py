"""RemediationRunner: the webhook receiver that turns alerts into Ansible runs, and its identity.

It declares the runner's Deployment and Service, a ServiceAccount bound to a ClusterRole with
exactly what the XID runbook does to a cluster, and nothing more:

    nodes            get, list, patch   (read the node, cordon, taint, label, promote a spare)
    pods             list               (find the node's pods: opt-out labels, drain)
    pods/eviction    create             (drain through the Eviction API, PDB-aware)
    events           create             (audit: a Kubernetes Event on the node)

No wildcard verbs, resources or API groups (the policy pack rejects them anywhere in the stack).
The webhook's bearer token is generated (components.secrets.RandomSecret) into a Secret
(`autoheal-runner-token`, key `token`): the runner reads it from a mounted file, Alertmanager
gets a reference to the same Secret, and the token itself is never in stack config. The routing
rules and the entry playbooks ship as ConfigMaps (their hash on the pod template rolls the runner
when they change); roles and the in-repo collection are part of the runner image. The incident
journal (SQLite) lives on a PersistentVolumeClaim, because nothing is acknowledged to
Alertmanager before it is on disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.common import (
    CONFIG_HASH_ANNOTATION,
    STATE_DIR_ANNOTATION,
    SecretRef,
    await_annotations,
    base_labels,
    child,
    content_hash,
)
from components.secrets import RandomSecret

RUNNER_NAME = "autoheal-runner"
TOKEN_SECRET_NAME = "autoheal-runner-token"  # noqa: S105 (a name, not a secret)
TOKEN_KEY = "token"  # noqa: S105 (a name, not a secret)
TOKEN_DIR = "/var/run/secrets/autoheal"  # noqa: S105 (a name, not a secret)
JOURNAL_DIR = "/var/lib/autoheal"
CONFIG_DIR = "/etc/autoheal/config"
PLAYBOOK_DIR = "/etc/autoheal/playbooks"

# (apiGroups, resources, verbs): the runbook's needs, spelled out; tests pin this exactly.
RUNNER_RBAC_RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], ...] = (
    (("",), ("nodes",), ("get", "list", "patch")),
    (("",), ("pods",), ("list",)),
    (("",), ("pods/eviction",), ("create",)),
    (("",), ("events",), ("create",)),
)


@dataclass(frozen=True)
class RemediationRunnerArgs:
    namespace: pulumi.Input[str] = "autoheal"
    image: str = "ghcr.io/autoheal/runner:0.1.0"
    port: int = 9095  # the runner listens here in its pod (its own default)
    service_port: int = 8080  # what Alertmanager calls: monitoring/alertmanager.yml ships this
    webhook_path: str = "/webhook"
    rules_yaml: str = "rules: []\n"
    playbooks: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    journal_size: str = "1Gi"
    journal_storage_class: str | None = None
    service_type: str = "ClusterIP"
    token_bytes: int = 32
    wait_for_rollout: bool = True

    def validate(self) -> None:
        if not self.webhook_path.startswith("/"):
            raise ValueError(f"webhook_path must start with '/', got {self.webhook_path!r}")
        if self.token_bytes < 16:
            raise ValueError(f"token_bytes must be at least 16, got {self.token_bytes}")
        for fname in self.playbooks:
            if "/" in fname or not fname.endswith((".yml", ".yaml")):
                raise ValueError(f"playbook {fname!r}: a file name ending in .yml or .yaml")


class RemediationRunner(pulumi.ComponentResource):
    webhook_url: pulumi.Output[str]
    token_secret: SecretRef
    service_account_name: pulumi.Output[str]
    cluster_role: k8s.rbac.v1.ClusterRole

    def __init__(
        self, name: str, args: RemediationRunnerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:runner:RemediationRunner", name, None, opts)
        args.validate()
        ns = args.namespace
        labels = base_labels(RUNNER_NAME, "remediation-runner")

        def meta(obj: str, **kw: Any) -> k8s.meta.v1.ObjectMetaArgs:
            return k8s.meta.v1.ObjectMetaArgs(name=obj, namespace=ns, labels=labels, **kw)

        sa = k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=meta(RUNNER_NAME), opts=child(self))
        self.service_account_name = sa.metadata.name
        self.cluster_role = k8s.rbac.v1.ClusterRole(
            f"{name}-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=RUNNER_NAME, labels=labels),
            rules=[
                k8s.rbac.v1.PolicyRuleArgs(
                    api_groups=list(groups), resources=list(resources), verbs=list(verbs)
                )
                for groups, resources, verbs in RUNNER_RBAC_RULES
            ],
            opts=child(self),
        )
        k8s.rbac.v1.ClusterRoleBinding(
            f"{name}-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=RUNNER_NAME, labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name=self.cluster_role.metadata.name,
            ),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=sa.metadata.name, namespace=ns)],
            opts=child(self),
        )

        password = RandomSecret(f"{name}-token", length=args.token_bytes, opts=child(self))
        token = k8s.core.v1.Secret(
            f"{name}-token",
            metadata=meta(TOKEN_SECRET_NAME),
            type="Opaque",
            string_data={TOKEN_KEY: password.token},
            opts=child(self, additional_secret_outputs=["stringData", "data"]),
        )
        self.token_secret = SecretRef(name=token.metadata.name, key=TOKEN_KEY, namespace=ns)

        # The runner's own config file (remediation.config.RunnerConfig): the keys that describe
        # this deployment's layout are set here; everything else passes through from `settings`.
        settings = {
            **args.settings,
            "listen_host": "0.0.0.0",  # noqa: S104 (inside the pod, behind the Service)
            "listen_port": args.port,
            "token_file": f"{TOKEN_DIR}/{TOKEN_KEY}",
            "journal_path": f"{JOURNAL_DIR}/journal.sqlite",
            "state_dir": f"{JOURNAL_DIR}/state",
            "rules_file": f"{CONFIG_DIR}/rules.yaml",
            "playbook_dir": PLAYBOOK_DIR,
            "dry_run": args.dry_run,
        }
        config_data = {
            "rules.yaml": args.rules_yaml,
            "runner.yaml": yaml.safe_dump(settings, sort_keys=True),
        }
        config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=meta(f"{RUNNER_NAME}-config"),
            data=config_data,
            opts=child(self),
        )
        playbooks = k8s.core.v1.ConfigMap(
            f"{name}-playbooks",
            metadata=meta(f"{RUNNER_NAME}-playbooks"),
            data=dict(sorted(args.playbooks.items())),
            opts=child(self),
        )
        skip = await_annotations(args.wait_for_rollout)
        journal = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-journal",
            metadata=meta(f"{RUNNER_NAME}-journal", annotations=skip or None),
            spec=k8s.core.v1.PersistentVolumeClaimSpecArgs(
                access_modes=["ReadWriteOnce"],
                storage_class_name=args.journal_storage_class,
                resources=k8s.core.v1.VolumeResourceRequirementsArgs(requests={"storage": args.journal_size}),
            ),
            opts=child(self),
        )
        http_probe = k8s.core.v1.HTTPGetActionArgs(path="/healthz", port="http")
        k8s.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta(RUNNER_NAME, annotations={STATE_DIR_ANNOTATION: JOURNAL_DIR, **skip}),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,  # one writer of the SQLite journal and of the per-node locks
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=labels,
                        annotations={CONFIG_HASH_ANNOTATION: content_hash(config_data, args.playbooks)},
                    ),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=sa.metadata.name,
                        security_context=k8s.core.v1.PodSecurityContextArgs(
                            run_as_non_root=True, run_as_user=10001, fs_group=10001
                        ),
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="runner",
                                image=args.image,
                                command=["autoheal", "serve", "--config", f"{CONFIG_DIR}/runner.yaml"],
                                env=[
                                    k8s.core.v1.EnvVarArgs(
                                        name="AUTOHEAL_TOKEN_FILE", value=f"{TOKEN_DIR}/{TOKEN_KEY}"
                                    ),
                                    k8s.core.v1.EnvVarArgs(
                                        name="AUTOHEAL_DRY_RUN", value=str(args.dry_run).lower()
                                    ),
                                ],
                                ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=args.port)],
                                volume_mounts=[
                                    k8s.core.v1.VolumeMountArgs(
                                        name="token", mount_path=TOKEN_DIR, read_only=True
                                    ),
                                    k8s.core.v1.VolumeMountArgs(
                                        name="config", mount_path=CONFIG_DIR, read_only=True
                                    ),
                                    k8s.core.v1.VolumeMountArgs(
                                        name="playbooks",
                                        mount_path=PLAYBOOK_DIR,
                                        read_only=True,
                                    ),
                                    k8s.core.v1.VolumeMountArgs(name="journal", mount_path=JOURNAL_DIR),
                                ],
                                readiness_probe=k8s.core.v1.ProbeArgs(http_get=http_probe, period_seconds=5),
                                liveness_probe=k8s.core.v1.ProbeArgs(
                                    http_get=http_probe,
                                    initial_delay_seconds=15,
                                    period_seconds=20,
                                ),
                                security_context=k8s.core.v1.SecurityContextArgs(
                                    allow_privilege_escalation=False,
                                    read_only_root_filesystem=True,
                                ),
                            )
                        ],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="token",
                                secret=k8s.core.v1.SecretVolumeSourceArgs(
                                    secret_name=token.metadata.name, default_mode=0o400
                                ),
                            ),
                            k8s.core.v1.VolumeArgs(
                                name="config",
                                config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=config.metadata.name),
                            ),
                            k8s.core.v1.VolumeArgs(
                                name="playbooks",
                                config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                                    name=playbooks.metadata.name
                                ),
                            ),
                            k8s.core.v1.VolumeArgs(
                                name="journal",
                                persistent_volume_claim=k8s.core.v1.PersistentVolumeClaimVolumeSourceArgs(
                                    claim_name=journal.metadata.name
                                ),
                            ),
                        ],
                    ),
                ),
            ),
            opts=child(self),
        )
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=meta(RUNNER_NAME, annotations=skip or None),
            spec=k8s.core.v1.ServiceSpecArgs(
                type=args.service_type,
                selector=labels,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=args.service_port, target_port="http")],
            ),
            opts=child(self),
        )
        self.webhook_url = pulumi.Output.all(service.metadata.name, service.metadata.namespace).apply(
            lambda a: f"http://{a[0]}.{a[1]}.svc:{args.service_port}{args.webhook_path}"
        )
        self.register_outputs(
            {
                "webhookUrl": self.webhook_url,
                "tokenSecret": token.metadata.name,
                "serviceAccount": sa.metadata.name,
            }
        )
