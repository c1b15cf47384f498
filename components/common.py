"""Shared vocabulary of the Pulumi components: label keys, taints, and child-naming helpers.

The runbook, the pool controller and the policy pack all read the same label and taint keys off
Kubernetes objects, so they are spelled once here instead of in each component. Nothing in this
module creates resources or reads `pulumi.Config`: components take plain arguments.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

LABEL_PREFIX = "autoheal.io"
POOL_LABEL = f"{LABEL_PREFIX}/pool"
GPU_MODEL_LABEL = f"{LABEL_PREFIX}/gpu-model"
SPARE_LABEL = f"{LABEL_PREFIX}/spare"
SPARE_TAINT_KEY = f"{LABEL_PREFIX}/spare"
WAIVER_ANNOTATION = f"{LABEL_PREFIX}/policy-waiver"
REMEDIATION_ANNOTATION = f"{LABEL_PREFIX}/remediation"
STATE_DIR_ANNOTATION = f"{LABEL_PREFIX}/state-dir"
CONFIG_HASH_ANNOTATION = f"{LABEL_PREFIX}/config-hash"
SKIP_AWAIT_ANNOTATION = "pulumi.com/skipAwait"

COMPONENT_LABEL = "app.kubernetes.io/component"
NAME_LABEL = "app.kubernetes.io/name"
PART_OF_LABEL = "app.kubernetes.io/part-of"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"

NODE_POOL_COMPONENT = "node-pool"
GPU_RESOURCE = "nvidia.com/gpu"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    """A Kubernetes node taint; pods that must run on such nodes get the matching toleration."""

    key: str
    effect: TaintEffect = "NoSchedule"
    value: str | None = None

    def toleration(self) -> k8s.core.v1.TolerationArgs:
        if self.value is None:
            return k8s.core.v1.TolerationArgs(key=self.key, operator="Exists", effect=self.effect)
        return k8s.core.v1.TolerationArgs(
            key=self.key, operator="Equal", value=self.value, effect=self.effect
        )

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value is not None:
            out["value"] = self.value
        return out


SPARE_TAINT = Taint(key=SPARE_TAINT_KEY, value="true", effect="NoSchedule")


def base_labels(name: str, component: str) -> dict[str, str]:
    """The recommended Kubernetes labels every object of ours carries."""
    return {
        NAME_LABEL: name,
        COMPONENT_LABEL: component,
        PART_OF_LABEL: "autoheal",
        MANAGED_BY_LABEL: "pulumi",
    }


def child(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    """Options for a component's child: always parented, so the provider and aliases flow down."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)


def await_annotations(wait_for_rollout: bool) -> dict[str, str]:
    """Workloads whose rollout Pulumi should not wait for (a lab without a storage provisioner or
    real kubelets) carry `pulumi.com/skipAwait`; everything else is awaited as usual."""
    return {} if wait_for_rollout else {SKIP_AWAIT_ANNOTATION: "true"}


def content_hash(*parts: Any) -> str:
    """A short stable digest of configuration for pod templates: a config change rolls them."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class SecretRef:
    """A key of a Kubernetes Secret, by reference: consumers mount or select it, never copy it."""

    name: pulumi.Input[str]
    key: str
    namespace: pulumi.Input[str]
