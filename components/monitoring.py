"""GpuMonitoring: dcgm-exporter on the GPU nodes, the XID alert rules, and the route to the runner.

* dcgm-exporter runs as a DaemonSet on every node that belongs to a GPU pool (the pool label
  exists), tolerating every taint: spares, quarantined and draining nodes are exactly the ones
  whose GPUs we must keep seeing. Adding a pool therefore changes nothing here.
* The XID watcher (`autoheal watch`, components.xid_watcher) runs beside it on the same nodes: it
  reads the kernel log and posts to Alertmanager (`alertmanager_url`) directly, so a GPU that fell
  off the bus is reported even when dcgm-exporter has lost it, in well under a second.
* The Prometheus rule group comes from `autoheal.monitoring.render_xid_rules()`, i.e. from the XID
  catalogue the runner also classifies with, so what alerts and what acts cannot disagree. With the
  Prometheus Operator (`prometheus_operator=True`) it is a PrometheusRule; otherwise a ConfigMap
  (`autoheal-xid-rules`, key `xid.rules.yml`) for a Prometheus that loads rule files. The
  degraded-node group (`render_degraded_rules()`, from the fault catalogue: GPU throttling, row
  remaps, stragglers) rides along: a second group of the PrometheusRule, key `degraded.rules.yml`.
* The Alertmanager route and webhook receiver come from
  `autoheal.monitoring.render_alertmanager_config()`, pointing at the runner Service's URL. The
  bearer token is only ever *referenced*: an AlertmanagerConfig's `credentials` selects the
  runner's token Secret, and the plain-file variant (ConfigMap `autoheal-alertmanager`) reads it
  from `credentials_file`, the path where Alertmanager mounts that Secret
  (`<secrets_dir>/<secret>/<key>`, the Prometheus Operator's `spec.secrets` layout).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from autoheal import labels as lb
from autoheal.monitoring import render_alertmanager_config, render_degraded_rules, render_xid_rules
from components import k8sargs
from components.common import SecretRef, await_annotations, base_labels, child
from components.xid_watcher import (
    DEFAULT_ALERTMANAGER_URL,
    DEFAULT_WATCHER_IMAGE,
    XidWatcherArgs,
    xid_watcher,
)

DCGM_PORT = 9400
DEFAULT_DCGM_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
POD_RESOURCES_DIR = (
    "/var/lib/kubelet/pod-resources"  # the kubelet tells dcgm-exporter which pod has which GPU
)
PROMETHEUS_OPERATOR = "monitoring.coreos.com"
# the Service the Prometheus Operator puts before its Prometheus (kube-prometheus-stack in monitoring)
PROMETHEUS_OPERATOR_URL = "http://prometheus-operated.monitoring.svc:9090"


@dataclass(frozen=True)
class GpuMonitoringArgs:
    webhook_url: pulumi.Input[str]
    token_secret: SecretRef
    namespace: pulumi.Input[str] = "autoheal"
    dcgm_image: str = DEFAULT_DCGM_IMAGE
    prometheus_operator: bool = False
    # on the PrometheusRule, ServiceMonitor and AlertmanagerConfig: the labels the operator's
    # Prometheus and Alertmanager select them by (kube-prometheus-stack: {release: <its release>})
    operator_labels: Mapping[str, str] = field(default_factory=dict)
    # Where Alertmanager mounts Secrets (the Prometheus Operator mounts `spec.secrets` here).
    alertmanager_secrets_dir: str = "/etc/alertmanager/secrets"
    group_wait: str = "0s"
    group_interval: str = "1s"
    repeat_interval: str = "1h"
    wait_for_rollout: bool = True
    # where the XID watchers post (Alertmanager's base URL), and the image they run from
    alertmanager_url: pulumi.Input[str] = DEFAULT_ALERTMANAGER_URL
    watcher_image: str = DEFAULT_WATCHER_IMAGE
    watcher_kernel_log_dir: str | None = None  # components.xid_watcher.XidWatcherArgs.kernel_log_dir
    watcher_resend_seconds: float = 60.0
    watcher_hold_seconds: float = 300.0
    # False where something else runs dcgm-exporter (the GPU Operator; the lab's GPU simulator)
    dcgm_exporter: bool = True


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


DCGM_LABELS = base_labels("dcgm-exporter", "gpu-metrics")
RULE_LABELS = base_labels("autoheal-xid-rules", "alert-rules")
ALERTMANAGER_LABELS = {
    **base_labels("autoheal-alertmanager", "alert-routing"),
    lb.ALERTMANAGER_CONFIG_LABEL: "true",
}


class GpuMonitoring(pulumi.ComponentResource):
    """dcgm-exporter, the XID rules and the route to the runner; see the module docstring."""

    rules: dict[str, Any]
    dcgm_exporter: k8s.apps.v1.DaemonSet | None
    xid_watcher: k8s.apps.v1.DaemonSet

    def __init__(
        self, name: str, args: GpuMonitoringArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("autoheal:monitoring:GpuMonitoring", name, None, opts)
        self._name, self._args = name, args
        skip = await_annotations(args.wait_for_rollout)
        self.dcgm_exporter = self._dcgm_exporter(skip) if args.dcgm_exporter else None
        self.xid_watcher = xid_watcher(
            self,
            name,
            XidWatcherArgs(
                args.namespace,
                args.alertmanager_url,
                args.watcher_image,
                kernel_log_dir=args.watcher_kernel_log_dir,
                resend_seconds=args.watcher_resend_seconds,
                hold_seconds=args.watcher_hold_seconds,
            ),
            skip,
        )
        self.rules = render_xid_rules()
        # faults that slow a job (autoheal/data/fault_catalog.yaml): DCGM throttling, row remaps, stragglers
        self.degraded_rules = render_degraded_rules()
        alertmanager = self._alertmanager_config()
        if args.prometheus_operator:
            self._operator_objects(alertmanager)
        else:
            self._config_files(alertmanager)
        groups = [*self.rules["groups"], *self.degraded_rules["groups"]]
        self.register_outputs({"ruleGroups": [g["name"] for g in groups]})

    def _dcgm_exporter(self, skip: dict[str, str]) -> k8s.apps.v1.DaemonSet:
        """On every node of a GPU pool (the pool label exists), whatever its taints: spares,
        quarantined and draining nodes are exactly the ones whose GPUs must stay visible."""
        ns = self._args.namespace
        pod = k8s.core.v1.PodSpecArgs(
            # off a node while the recovery ladder resets or validates its GPUs (it holds them
            # through NVML); back when the ladder lifts the label (roles/ladder/tasks/holders.yml)
            affinity=k8sargs.required_node_affinity(
                [k8sargs.node_has(lb.POOL_LABEL), k8sargs.gpu_agents_running()]
            ),
            tolerations=[k8s.core.v1.TolerationArgs(operator="Exists")],
            containers=[_dcgm_container(self._args.dcgm_image)],
            volumes=[
                k8s.core.v1.VolumeArgs(
                    name="pod-resources",
                    host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=POD_RESOURCES_DIR, type="Directory"),
                )
            ],
        )
        scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(DCGM_PORT)}
        daemon_set = k8s.apps.v1.DaemonSet(
            f"{self._name}-dcgm-exporter",
            metadata=k8sargs.meta("dcgm-exporter", ns, DCGM_LABELS, skip),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8sargs.selector(DCGM_LABELS), template=k8sargs.template(DCGM_LABELS, pod, scrape)
            ),
            opts=child(self),
        )
        k8s.core.v1.Service(
            f"{self._name}-dcgm-exporter",
            metadata=k8sargs.meta("dcgm-exporter", ns, DCGM_LABELS, skip),
            spec=k8sargs.headless_service(DCGM_LABELS, "metrics", DCGM_PORT),
            opts=child(self),
        )
        return daemon_set

    def _alertmanager_config(self) -> pulumi.Output[dict[str, Any]]:
        """The receiver and route of `render_alertmanager_config`, with the token file where
        Alertmanager mounts the runner's Secret (`<secrets_dir>/<secret>/<key>`)."""
        args = self._args
        secret = args.token_secret

        def render(url: str, secret_name: str) -> dict[str, Any]:
            return render_alertmanager_config(
                url,
                f"{args.alertmanager_secrets_dir}/{secret_name}/{secret.key}",
                group_wait=args.group_wait,
                group_interval=args.group_interval,
                repeat_interval=args.repeat_interval,
            )

        return pulumi.Output.all(args.webhook_url, secret.name).apply(lambda a: render(a[0], a[1]))

    def _operator_objects(self, alertmanager: pulumi.Output[dict[str, Any]]) -> None:
        """With the Prometheus Operator: a PrometheusRule, a ServiceMonitor and an
        AlertmanagerConfig whose credentials select the runner's token Secret."""
        secret = self._args.token_secret
        monitor = {
            "selector": {"matchLabels": DCGM_LABELS},
            "endpoints": [{"port": "metrics", "interval": "15s"}],
        }
        route = pulumi.Output.all(alertmanager, secret.name).apply(
            lambda a: alertmanager_config_spec(a[0], a[1], secret.key)
        )
        rules = {"groups": [*self.rules["groups"], *self.degraded_rules["groups"]]}
        self._custom("xid-rules", "v1", "PrometheusRule", "autoheal-xid-rules", RULE_LABELS, rules)
        self._custom("dcgm-monitor", "v1", "ServiceMonitor", "dcgm-exporter", DCGM_LABELS, monitor)
        self._custom(
            "alertmanager", "v1alpha1", "AlertmanagerConfig", "autoheal-runner", ALERTMANAGER_LABELS, route
        )

    def _custom(
        self, suffix: str, version: str, kind: str, obj: str, labels: dict[str, str], spec: pulumi.Input[Any]
    ) -> None:
        k8s.apiextensions.CustomResource(
            f"{self._name}-{suffix}",
            api_version=f"{PROMETHEUS_OPERATOR}/{version}",
            kind=kind,
            metadata=k8sargs.meta(obj, self._args.namespace, {**self._args.operator_labels, **labels}),
            spec=spec,
            opts=child(self),
        )

    def _config_files(self, alertmanager: pulumi.Output[dict[str, Any]]) -> None:
        """Without the operator: ConfigMaps for a Prometheus and an Alertmanager that load files;
        the annotation names the token Secret Alertmanager must mount."""
        ns, secret = self._args.namespace, self._args.token_secret
        k8s.core.v1.ConfigMap(
            f"{self._name}-xid-rules",
            metadata=k8sargs.meta("autoheal-xid-rules", ns, RULE_LABELS),
            data={
                "xid.rules.yml": yaml.safe_dump(self.rules, sort_keys=False),
                "degraded.rules.yml": yaml.safe_dump(self.degraded_rules, sort_keys=False),
            },
            opts=child(self),
        )
        secret_annotation = pulumi.Output.concat(secret.namespace, "/", secret.name)
        k8s.core.v1.ConfigMap(
            f"{self._name}-alertmanager",
            metadata=k8sargs.meta(
                "autoheal-alertmanager",
                ns,
                ALERTMANAGER_LABELS,
                {lb.TOKEN_SECRET_ANNOTATION: secret_annotation},
            ),
            data={"alertmanager.yml": alertmanager.apply(lambda c: yaml.safe_dump(c, sort_keys=False))},
            opts=child(self),
        )


def _dcgm_container(image: str) -> k8s.core.v1.ContainerArgs:
    return k8s.core.v1.ContainerArgs(
        name="dcgm-exporter",
        image=image,
        env=[
            k8sargs.env("DCGM_EXPORTER_KUBERNETES", "true"),
            k8sargs.env("DCGM_EXPORTER_LISTEN", f":{DCGM_PORT}"),
            k8sargs.field_env("NODE_NAME", "spec.nodeName"),
        ],
        ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=DCGM_PORT)],
        security_context=k8s.core.v1.SecurityContextArgs(
            capabilities=k8s.core.v1.CapabilitiesArgs(add=["SYS_ADMIN"])
        ),
        readiness_probe=k8sargs.http_probe("/health", DCGM_PORT, period=10),
        liveness_probe=k8sargs.http_probe("/health", DCGM_PORT, period=20, initial=45),
        volume_mounts=[k8sargs.mount("pod-resources", POD_RESOURCES_DIR, read_only=True)],
    )
