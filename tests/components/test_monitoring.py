"""GpuMonitoring: dcgm-exporter on every GPU node, XID rules from the catalogue, and the Alertmanager
receiver pointing at the runner with the token by reference only."""

from __future__ import annotations

import yaml

from autoheal.monitoring import render_alertmanager_config, render_degraded_rules, render_xid_rules
from components.common import SecretRef
from components.monitoring import GpuMonitoring, GpuMonitoringArgs
from tests.components.harness import pod_spec, run_program

URL = "http://autoheal-runner.autoheal.svc:8080/webhook"
TOKEN = SecretRef(name="autoheal-runner-token", key="token", namespace="autoheal")


def test_rules_config_map_is_the_catalogue_rule_group(lab):
    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-xid-rules")
    assert yaml.safe_load(cm.inputs["data"]["xid.rules.yml"]) == render_xid_rules()
    assert yaml.safe_load(cm.inputs["data"]["degraded.rules.yml"]) == render_degraded_rules()


def test_alertmanager_receiver_points_at_the_runner_with_a_token_file(lab):
    cm = lab.one("kubernetes:core/v1:ConfigMap", "autoheal-alertmanager")
    am = yaml.safe_load(cm.inputs["data"]["alertmanager.yml"])
    (hook,) = next(r for r in am["receivers"] if r["name"] == "autoheal-runner")["webhook_configs"]
    assert hook["url"] == lab.value["webhook_url"] == URL
    assert hook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/alertmanager/secrets/autoheal-runner-token/token",
    }
    assert cm.inputs["metadata"]["annotations"]["autoheal.io/token-secret"] == (
        "autoheal/autoheal-runner-token"
    )
    assert am == render_alertmanager_config(
        URL, "/etc/alertmanager/secrets/autoheal-runner-token/token", group_interval="1s"
    )


def test_the_token_value_never_appears_in_monitoring_objects(lab):
    token = lab.one("kubernetes:core/v1:Secret", "autoheal-runner-token").inputs["stringData"]["token"]
    for r in lab.resources:
        if r.parent.endswith("autoheal:monitoring:GpuMonitoring::monitoring"):
            assert token not in repr(r.inputs), r.k8s_name


def test_dcgm_exporter_runs_on_every_gpu_node_including_spares_and_quarantined(lab):
    ds = lab.one("kubernetes:apps/v1:DaemonSet", "dcgm-exporter")
    spec = pod_spec(ds)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # ... but not while the recovery ladder has stopped the node's GPU agents (holders.yml)
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "autoheal.io/pool", "operator": "Exists"},
                {"key": "autoheal.io/gpu-agents", "operator": "NotIn", "values": ["stopped"]},
            ]
        }
    ]
    assert spec["tolerations"] == [{"operator": "Exists"}]
    (c,) = spec["containers"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400}]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    svc = lab.one("kubernetes:core/v1:Service", "dcgm-exporter")
    assert svc.inputs["spec"]["ports"][0]["port"] == 9400


def test_with_the_operator_rules_and_route_are_custom_resources_with_a_secret_selector():
    rec = run_program(
        lambda: GpuMonitoring(
            "m", GpuMonitoringArgs(webhook_url=URL, token_secret=TOKEN, prometheus_operator=True)
        )
    )
    crs = {r.inputs["kind"]: r for r in rec.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")}
    assert crs["PrometheusRule"].inputs["spec"] == {
        "groups": render_xid_rules()["groups"] + render_degraded_rules()["groups"]
    }
    (amc,) = rec.of_type("kubernetes:monitoring.coreos.com/v1alpha1:AlertmanagerConfig")
    spec = amc.inputs["spec"]
    (receiver,) = spec["receivers"]
    (hook,) = receiver["webhookConfigs"]
    assert hook["url"] == URL
    assert hook["httpConfig"]["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "autoheal-runner-token", "key": "token"},
    }
    assert spec["route"]["receiver"] == receiver["name"] == "autoheal-runner"
    assert spec["route"]["matchers"] == [
        {"name": "alertname", "matchType": "=~", "value": "GpuXidFatal|NodeDegraded"}
    ]
    assert rec.of_type("kubernetes:monitoring.coreos.com/v1:ServiceMonitor")
    assert not rec.of_type("kubernetes:core/v1:ConfigMap")
