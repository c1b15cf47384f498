"""What every component shares: taints, the recommended labels, child options, config hashes.

Label, taint and annotation keys are not defined here: they are part of the contract with the
runbook, the runner and the lab, so they live once in `autoheal.labels`. Nothing in this module
creates resources or reads `pulumi.Config`: components take plain arguments.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import pulumi
import pulumi_kubernetes as k8s

from autoheal import labels as lb

# Pulumi's own annotation (pulumi-kubernetes): do not wait for the object to become ready.
SKIP_AWAIT_ANNOTATION = "pulumi.com/skipAwait"

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    """A Kubernetes node taint; pods that must run on such nodes get the matching toleration."""

    key: str
    effect: TaintEffect = "NoSchedule"
    value: str | None = None

    @classmethod
    def of(cls, spec: dict[str, str]) -> Taint:
        """From the dict shape `autoheal.labels` spells taints in."""
        effect: Any = spec.get("effect", "NoSchedule")
        return cls(key=spec["key"], value=spec.get("value"), effect=effect)

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


SPARE_TAINT = Taint.of(lb.spare_taint())


def base_labels(name: str, component: str) -> dict[str, str]:
    """The recommended Kubernetes labels every object of ours carries."""
    return {
        lb.NAME_LABEL: name,
        lb.COMPONENT_LABEL: component,
        lb.PART_OF_LABEL: "autoheal",
        lb.MANAGED_BY_LABEL: "pulumi",
    }


def child(parent: pulumi.Resource, **kwargs: Any) -> pulumi.ResourceOptions:
    """Options for a component's child: always parented, so the provider and aliases flow down."""
    return pulumi.ResourceOptions(parent=parent, **kwargs)


class SubComponent(pulumi.ComponentResource):
    """A component carved out of a bigger one, whose resources used to be the parent's children.

    Moving a resource under a new parent changes its URN, which Pulumi reads as "delete the old,
    create a new" (a replacement: for a StatefulSet or a PVC, lost state). `adopt()` gives each
    moved resource an alias to its former parent, so an existing stack previews no replacement.
    """

    def __init__(self, type_: str, name: str, owner: str, opts: pulumi.ResourceOptions | None) -> None:
        super().__init__(type_, name, None, opts)
        # Children keep the logical names they had under the parent (`<owner>-...`): a new name
        # would be a replacement too.
        self.owner = owner
        self._former_parent = opts.parent if opts is not None else None

    def adopt(self, **kwargs: Any) -> pulumi.ResourceOptions:
        """Options for a child that used to belong to this component's parent."""
        aliases = [pulumi.Alias(parent=self._former_parent)] if self._former_parent is not None else []
        return child(self, aliases=aliases, **kwargs)


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
