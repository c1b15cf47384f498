"""The Prometheus Operator, where the stack uses it (monitoring.prometheusOperator): its CRDs
are installed, and a Prometheus (an Alertmanager) selects the objects the stack makes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from components.config import StackSpec
from components.preflight.model import MONITORING_GROUP, Check, ClusterView
from components.preflight.objects import labels_of, name_of, selector_matches

OPERATOR_CRDS = ("prometheusrules", "servicemonitors", "alertmanagerconfigs")


def selects(
    owner: Mapping[str, Any],
    selector_key: str,
    ns_selector_key: str,
    labels: Mapping[str, str],
    namespace: str,
    namespace_labels: Mapping[str, str],
) -> bool:
    """Whether a Prometheus or Alertmanager object picks up an object of ours: its selector
    matches our labels (absent: none), and its namespace selector our namespace (absent: only
    its own namespace), as the Prometheus Operator reads them."""
    spec = owner.get("spec") or {}
    if not selector_matches(spec.get(selector_key), labels):
        return False
    ns_selector = spec.get(ns_selector_key)
    if ns_selector is None:
        return bool(owner.get("metadata", {}).get("namespace") == namespace)
    return selector_matches(ns_selector, namespace_labels)


def check_prometheus_operator(cfg: StackSpec, view: ClusterView) -> list[Check]:
    if not cfg.monitoring.prometheus_operator:
        return []
    if view.crds is None:
        return [
            view.unlisted(
                "prometheus operator: CRDs",
                "CustomResourceDefinitions",
                "customresourcedefinitions",
                "apiextensions",
                "let the kubeconfig's user list customresourcedefinitions",
            )
        ]
    missing = [f"{p}.{MONITORING_GROUP}" for p in OPERATOR_CRDS if p not in view.crds]
    if missing:
        return [
            Check(
                "prometheus operator: CRDs",
                "fail",
                f"monitoring.prometheusOperator is true, but {', '.join(missing)} not installed",
                "install the Prometheus Operator (e.g. the kube-prometheus-stack chart) with its CRDs, "
                "or set monitoring.prometheusOperator: false",
            )
        ]
    return [
        Check("prometheus operator: CRDs", "pass", ", ".join(OPERATOR_CRDS) + " present"),
        _selector_check(cfg, view, cfg.monitoring.operator_labels),
    ]


def _owner(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace')}/{name_of(obj)}"


def _selector_check(cfg: StackSpec, view: ClusterView, extra: Mapping[str, str]) -> Check:
    """Whether a Prometheus (an Alertmanager) takes the objects with the labels the monitoring
    component gives them: `monitoring.operatorLabels` under the component's own."""
    row = "prometheus operator: selectors"
    try:  # the labels the monitoring component gives its objects (imported here: it loads Pulumi)
        from components.common import base_labels
        from components.monitoring import ALERTMANAGER_LABELS, DCGM_LABELS, RULE_LABELS
    except ImportError as exc:  # a CLI installed without the `pulumi` extra
        return Check(row, "info", f"not checked: the objects' labels come from the Pulumi components ({exc})")
    ns = cfg.namespace
    ns_labels = {
        **base_labels("autoheal", "namespace"),
        **labels_of(view.namespace or {}),
        "kubernetes.io/metadata.name": ns,
    }
    if not view.prometheuses:
        return Check(
            row,
            "warn",
            "no Prometheus object in the cluster: the rules and the ServiceMonitor would be loaded by none",
            "create a Prometheus (kube-prometheus-stack does) or point monitoring at the one you run",
        )
    wants = _selections(extra, RULE_LABELS, DCGM_LABELS, ALERTMANAGER_LABELS, view)
    unselected, selected = [], []
    for kind, labels, owners, sel, ns_sel in wants:
        by = [_owner(o) for o in owners if selects(o, sel, ns_sel, labels, ns, ns_labels)]
        if by:
            selected.append(f"{kind} by {by[0]}")
        elif owners:
            shown = {_owner(o): (o.get("spec") or {}).get(sel) for o in owners}
            unselected.append(f"{kind} (namespace {ns}) is selected by none of {json.dumps(shown)[:300]}")
        else:  # no Alertmanager object (Prometheus objects were checked for above)
            selected.append(f"{kind}: no Alertmanager object to select it (not checked)")
    if unselected:
        return Check(
            row,
            "fail",
            "; ".join(unselected),
            "set monitoring.operatorLabels to the labels those selectors match (kube-prometheus-stack: "
            "{release: <its release name>}), and let their namespace selectors take namespace " + ns,
        )
    return Check(row, "pass", "; ".join(selected))


_Selection = tuple[str, dict[str, str], Sequence[Mapping[str, Any]], str, str]


def _selections(
    extra: Mapping[str, str],
    rule_labels: Mapping[str, str],
    dcgm_labels: Mapping[str, str],
    alertmanager_labels: Mapping[str, str],
    view: ClusterView,
) -> list[_Selection]:
    """(kind of our object, its labels, the objects that may select it, their two selector keys)"""
    prometheuses = view.prometheuses or []
    return [
        (
            "PrometheusRule",
            {**extra, **rule_labels},
            prometheuses,
            "ruleSelector",
            "ruleNamespaceSelector",
        ),
        (
            "ServiceMonitor",
            {**extra, **dcgm_labels},
            prometheuses,
            "serviceMonitorSelector",
            "serviceMonitorNamespaceSelector",
        ),
        (
            "AlertmanagerConfig",
            {**extra, **alertmanager_labels},
            view.alertmanagers or [],
            "alertmanagerConfigSelector",
            "alertmanagerConfigNamespaceSelector",
        ),
    ]
