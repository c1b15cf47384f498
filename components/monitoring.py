"""GpuMonitoring: dcgm-exporter on the GPU nodes, the XID alert rules, and the route to the runner.

* dcgm-exporter runs as a DaemonSet on every node that belongs to a GPU pool (the pool label
  exists), tolerating every taint: spares, quarantined and draining nodes are exactly the ones
  whose GPUs we must keep seeing. Adding a pool therefore changes nothing here.
* The Prometheus rule group comes from `autoheal.monitoring.render_xid_rules()`, i.e. from the XID
  catalogue the runner also classifies with, so what alerts and what acts cannot disagree. With the
  Prometheus Operator (`prometheus_operator=True`) it is a PrometheusRule; otherwise a ConfigMap
  (`autoheal-xid-rules`, key `xid.rules.yml`) for a Prometheus that loads rule files.
* The Alertmanager route and webhook receiver come from
  `autoheal.monitoring.render_alertmanager_config()`, pointing at the runner Service's URL. The
  bearer token is only ever *referenced*: an AlertmanagerConfig's `credentials` selects the
  runner's token Secret, and the plain-file variant (ConfigMap `autoheal-alertmanager`) reads it
  from `credentials_file`, the path where Alertmanager mounts that Secret
  (`<secrets_dir>/<secret>/<key>`, the Prometheus Operator's `spec.secrets` layout).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from autoheal.monitoring import render_alertmanager_config, render_xid_rules
from components.common import (
    POOL_LABEL,
    SecretRef,
    await_annotations,
    base_labels,
    child,
)

DCGM_PORT = 9400
DEFAULT_DCGM_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
TOKEN_SECRET_ANNOTATION = "autoheal.io/token-secret"  # noqa: S105 (a key name)
ALERTMANAGER_CONFIG_LABEL = "autoheal.io/alertmanager-config"


@dataclass(frozen=True)
class GpuMonitoringArgs:
    webhook_url: pulumi.Input[str]
    token_secret: SecretRef
    namespace: pulumi.Input[str] = "autoheal"
    dcgm_image: str = DEFAULT_DCGM_IMAGE
    prometheus_operator: bool = False
    # Where Alertmanager mounts Secrets (the Prometheus Operator mounts `spec.secrets` here).
    alertmanager_secrets_dir: str = "/etc/alertmanager/secrets"
    group_wait: str = "0s"
    group_interval: str = "1s"
    repeat_interval: str = "1h"
    wait_for_rollout: bool = True


def _matcher(text: str) -> dict[str, str]:
    m = re.fullmatch(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*', text)
    if m is None:
        raise ValueError(f"cannot translate Alertmanager matcher {text!r}")
    return {"name": m.group(1), "matchType": m.group(2), "value": m.group(3)}


def alertmanager_config_spec(am: dict[str, Any], secret_name: str, secret_key: str) -> dict[str, Any]:
    """The AlertmanagerConfig (monitoring.coreos.com/v1alpha1) spec equivalent to the receiver and
    route of `render_alertmanager_config`, with the token as a Secret key selector."""
    receivers: list[dict[str, Any]] = []
    for rcv in am["receivers"]:
        hooks = []
        for hook in rcv.get("webhook_configs", []):
            auth = hook.get("http_config", {}).get("authorization", {})
            hooks.append(
                {
                    "url": hook["url"],
                    "sendResolved": hook.get("send_resolved", True),
                    "maxAlerts": hook.get("max_alerts", 0),
                    "httpConfig": {
                        "authorization": {
                            "type": auth.get("type", "Bearer"),
                            "credentials": {"name": secret_name, "key": secret_key},
                        }
                    },
                }
            )
        if hooks:
            receivers.append({"name": rcv["name"], "webhookConfigs": hooks})
    routes = []
    for r in am["route"].get("routes", []):
        if r["receiver"] not in {x["name"] for x in receivers}:
            continue
        routes.append(
            {
                "receiver": r["receiver"],
                "matchers": [_matcher(m) for m in r.get("matchers", [])],
                "groupBy": r.get("group_by", []),
                "groupWait": r.get("group_wait"),
                "groupInterval": r.get("group_interval"),
                "repeatInterval": r.get("repeat_interval"),
            }
        )
    if len(routes) != 1:
        raise ValueError(f"expected one route to the runner, found {len(routes)}")
    return {"route": routes[0], "receivers": receivers}


class GpuMonitoring(pulumi.ComponentResource):
    rules: dict[str, Any]
    dcgm_exporter: k8s.apps.v1.DaemonSet

    def __init__(
        self, name: str, args: GpuMonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:monitoring:GpuMonitoring", name, None, opts)
        ns = args.namespace
        skip = await_annotations(args.wait_for_rollout)
        dcgm_labels = base_labels("dcgm-exporter", "gpu-metrics")

        self.dcgm_exporter = k8s.apps.v1.DaemonSet(
            f"{name}-dcgm-exporter",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="dcgm-exporter", namespace=ns, labels=dcgm_labels, annotations=skip or None
            ),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=dcgm_labels),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        labels=dcgm_labels,
                        annotations={
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(DCGM_PORT),
                        },
                    ),
                    spec=k8s.core.v1.PodSpecArgs(
                        affinity=k8s.core.v1.AffinityArgs(
                            node_affinity=k8s.core.v1.NodeAffinityArgs(
                                required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                                    node_selector_terms=[
                                        k8s.core.v1.NodeSelectorTermArgs(
                                            match_expressions=[
                                                k8s.core.v1.NodeSelectorRequirementArgs(
                                                    key=POOL_LABEL, operator="Exists"
                                                )
                                            ]
                                        )
                                    ]
                                )
                            )
                        ),
                        tolerations=[k8s.core.v1.TolerationArgs(operator="Exists")],
                        containers=[
                            k8s.core.v1.ContainerArgs(
                                name="dcgm-exporter",
                                image=args.dcgm_image,
                                env=[
                                    k8s.core.v1.EnvVarArgs(name="DCGM_EXPORTER_KUBERNETES", value="true"),
                                    k8s.core.v1.EnvVarArgs(
                                        name="DCGM_EXPORTER_LISTEN", value=f":{DCGM_PORT}"
                                    ),
                                    k8s.core.v1.EnvVarArgs(
                                        name="NODE_NAME",
                                        value_from=k8s.core.v1.EnvVarSourceArgs(
                                            field_ref=k8s.core.v1.ObjectFieldSelectorArgs(
                                                field_path="spec.nodeName"
                                            )
                                        ),
                                    ),
                                ],
                                ports=[
                                    k8s.core.v1.ContainerPortArgs(name="metrics", container_port=DCGM_PORT)
                                ],
                                security_context=k8s.core.v1.SecurityContextArgs(
                                    capabilities=k8s.core.v1.CapabilitiesArgs(add=["SYS_ADMIN"])
                                ),
                                readiness_probe=k8s.core.v1.ProbeArgs(
                                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port=DCGM_PORT),
                                    period_seconds=10,
                                ),
                                liveness_probe=k8s.core.v1.ProbeArgs(
                                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port=DCGM_PORT),
                                    initial_delay_seconds=45,
                                    period_seconds=20,
                                ),
                                volume_mounts=[
                                    k8s.core.v1.VolumeMountArgs(
                                        name="pod-resources",
                                        mount_path="/var/lib/kubelet/pod-resources",
                                        read_only=True,
                                    )
                                ],
                            )
                        ],
                        volumes=[
                            k8s.core.v1.VolumeArgs(
                                name="pod-resources",
                                host_path=k8s.core.v1.HostPathVolumeSourceArgs(
                                    path="/var/lib/kubelet/pod-resources", type="Directory"
                                ),
                            )
                        ],
                    ),
                ),
            ),
            opts=child(self),
        )
        k8s.core.v1.Service(
            f"{name}-dcgm-exporter",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="dcgm-exporter", namespace=ns, labels=dcgm_labels, annotations=skip or None
            ),
            spec=k8s.core.v1.ServiceSpecArgs(
                cluster_ip="None",
                selector=dcgm_labels,
                ports=[k8s.core.v1.ServicePortArgs(name="metrics", port=DCGM_PORT)],
            ),
            opts=child(self),
        )

        self.rules = render_xid_rules()
        rule_labels = base_labels("autoheal-xid-rules", "alert-rules")
        secret = args.token_secret
        am_labels = {
            **base_labels("autoheal-alertmanager", "alert-routing"),
            ALERTMANAGER_CONFIG_LABEL: "true",
        }

        def am_config(url: str, secret_name: str) -> dict[str, Any]:
            token_file = f"{args.alertmanager_secrets_dir}/{secret_name}/{secret.key}"
            return render_alertmanager_config(
                url,
                token_file,
                group_wait=args.group_wait,
                group_interval=args.group_interval,
                repeat_interval=args.repeat_interval,
            )

        am = pulumi.Output.all(args.webhook_url, secret.name).apply(lambda a: am_config(a[0], a[1]))
        secret_annotation = pulumi.Output.concat(secret.namespace, "/", secret.name)
        if args.prometheus_operator:
            k8s.apiextensions.CustomResource(
                f"{name}-xid-rules",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name="autoheal-xid-rules", namespace=ns, labels=rule_labels
                ),
                spec=self.rules,
                opts=child(self),
            )
            k8s.apiextensions.CustomResource(
                f"{name}-dcgm-monitor",
                api_version="monitoring.coreos.com/v1",
                kind="ServiceMonitor",
                metadata=k8s.meta.v1.ObjectMetaArgs(name="dcgm-exporter", namespace=ns, labels=dcgm_labels),
                spec={
                    "selector": {"matchLabels": dcgm_labels},
                    "endpoints": [{"port": "metrics", "interval": "15s"}],
                },
                opts=child(self),
            )
            k8s.apiextensions.CustomResource(
                f"{name}-alertmanager",
                api_version="monitoring.coreos.com/v1alpha1",
                kind="AlertmanagerConfig",
                metadata=k8s.meta.v1.ObjectMetaArgs(name="autoheal-runner", namespace=ns, labels=am_labels),
                spec=pulumi.Output.all(am, secret.name).apply(
                    lambda a: alertmanager_config_spec(a[0], a[1], secret.key)
                ),
                opts=child(self),
            )
        else:
            k8s.core.v1.ConfigMap(
                f"{name}-xid-rules",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name="autoheal-xid-rules", namespace=ns, labels=rule_labels
                ),
                data={"xid.rules.yml": yaml.safe_dump(self.rules, sort_keys=False)},
                opts=child(self),
            )
            k8s.core.v1.ConfigMap(
                f"{name}-alertmanager",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name="autoheal-alertmanager",
                    namespace=ns,
                    labels=am_labels,
                    annotations={TOKEN_SECRET_ANNOTATION: secret_annotation},
                ),
                data={"alertmanager.yml": am.apply(lambda c: yaml.safe_dump(c, sort_keys=False))},
                opts=child(self),
            )
        self.register_outputs({"ruleGroups": [g["name"] for g in self.rules["groups"]]})
