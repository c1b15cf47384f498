"""A stack's preview as the review reports it: one `Step` per resource the change affects.

Two sources produce it. The real engine's events (`pulumi preview --json`, streamed): the engine
and the provider decided every operation, replacements included. And the mocks' comparison of
what the two revisions declare (`diff_declared`), for stacks whose cloud cannot be reached: there
the operation is derived here, with the properties each provider replaces a resource for
(`REPLACED_ON_CHANGE`) standing in for the provider's own diff.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from review.mockstack import Recorded, Res

CREATE, UPDATE, REPLACE, DELETE = "create", "update", "replace", "delete"
# Engine step ops -> the four the review reports ("same", "read", ... are not changes).
ENGINE_OPS = {
    "create": CREATE,
    "update": UPDATE,
    "replace": REPLACE,
    "create-replacement": REPLACE,
    "delete-replaced": REPLACE,
    "discard-replaced": REPLACE,
    "delete": DELETE,
    "discard": DELETE,
}
STACK_TYPE = "pulumi:pulumi:Stack"

# Inputs whose change makes the provider replace the resource rather than update it: the
# immutable fields of the Kubernetes API (pulumi-kubernetes replaces on them), the force-new
# arguments of the AWS resources the components use, and our dynamic providers' `replaces`.
_K8S_IDENTITY = ("metadata.name", "metadata.namespace", "apiVersion", "kind")
REPLACED_ON_CHANGE: dict[str, tuple[str, ...]] = {
    "kubernetes:apps/v1:StatefulSet": (
        *_K8S_IDENTITY,
        "spec.selector",
        "spec.serviceName",
        "spec.volumeClaimTemplates",
        "spec.podManagementPolicy",
    ),
    "kubernetes:apps/v1:Deployment": (*_K8S_IDENTITY, "spec.selector"),
    "kubernetes:apps/v1:DaemonSet": (*_K8S_IDENTITY, "spec.selector"),
    "kubernetes:core/v1:PersistentVolumeClaim": (
        *_K8S_IDENTITY,
        "spec.accessModes",
        "spec.storageClassName",
        "spec.volumeMode",
        "spec.volumeName",
        "spec.selector",
    ),
    "kubernetes:core/v1:Service": (*_K8S_IDENTITY, "spec.clusterIP"),
    "kubernetes:core/v1:Secret": (*_K8S_IDENTITY, "type"),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": (*_K8S_IDENTITY, "roleRef"),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": (*_K8S_IDENTITY, "roleRef"),
    "aws:eks/nodeGroup:NodeGroup": (
        "amiType",
        "capacityType",
        "clusterName",
        "diskSize",
        "instanceTypes",
        "nodeGroupName",
        "nodeRoleArn",
        "subnetIds",
        "remoteAccess",
    ),
    "aws:eks/cluster:Cluster": ("name", "roleArn", "vpcConfig.subnetIds", "kubernetesNetworkConfig"),
    "aws:iam/role:Role": ("name", "path"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": ("role", "policyArn"),
    "pulumi:providers:aws": ("region",),
    "pulumi-python:dynamic:Resource": ("length", "comment"),
}
# Any other Kubernetes kind: its identity is immutable.
_K8S_DEFAULT = _K8S_IDENTITY


@dataclass(frozen=True)
class Step:
    op: str  # create | update | replace | delete
    urn: str
    type: str
    name: str
    keys: tuple[str, ...] = ()  # the properties that differ (for a replacement: that force it)
    old: Mapping[str, Any] = field(default_factory=dict)  # inputs before (update, replace, delete)
    new: Mapping[str, Any] = field(default_factory=dict)  # inputs after (create, update, replace)
    custom: bool = True

    @property
    def inputs(self) -> Mapping[str, Any]:
        """The inputs that describe the resource: after the change, or before a deletion."""
        return self.new or self.old


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    same: set[str] = field(default_factory=set)  # URNs of the custom resources left as they are

    @property
    def unchanged(self) -> int:
        return len(self.same - {s.urn for s in self.steps})

    def count(self, op: str) -> int:
        return sum(1 for s in self.steps if s.op == op and s.custom)

    def of(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]


def type_of_urn(urn: str) -> str:
    return urn.split("::")[2].split("$")[-1]


def name_of_urn(urn: str) -> str:
    return urn.split("::")[-1]


# --- the real engine -----------------------------------------------------------------------


def read_event_log(path: Path) -> list[dict[str, Any]]:
    """The engine's events: one JSON object per line (anything else on the stream is skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def plan_from_events(events: Iterable[Mapping[str, Any]]) -> Plan:
    """The preview's steps from the engine's resourcePreEvents (one per step; a replacement may
    come as replace, or as create-replacement + delete-replaced: merged into one step)."""
    plan = Plan()
    by_urn: dict[str, Step] = {}
    for event in events:
        meta = (event.get("resourcePreEvent") or {}).get("metadata")
        if not meta or meta.get("type") == STACK_TYPE:
            continue
        op = ENGINE_OPS.get(str(meta.get("op")))
        old, new = meta.get("old") or {}, meta.get("new") or {}
        custom = bool((new or old).get("custom", False))  # components: no "custom" (omitempty)
        urn = str(meta["urn"])
        if op is None:
            if meta.get("op") == "same" and custom:
                plan.same.add(urn)
            continue
        # keys: what forces a replacement; diffs / detailedDiff: what an update changes
        changed = meta.get("diffs") or sorted(meta.get("detailedDiff") or {})
        keys = tuple(meta.get("keys") or ()) if op == REPLACE else tuple(changed)
        step = Step(
            op=op,
            urn=urn,
            type=str(meta.get("type") or type_of_urn(urn)),
            name=name_of_urn(urn),
            keys=keys,
            old=old.get("inputs") or {},
            new=new.get("inputs") or {},
            custom=custom,
        )
        if urn in by_urn and op == REPLACE:
            prev = by_urn[urn]
            step = Step(REPLACE, urn, step.type, step.name, prev.keys or step.keys, prev.old or step.old,
                        prev.new or step.new, step.custom)  # fmt: skip
        by_urn[urn] = step
    plan.steps = list(by_urn.values())
    return plan


def resources_from_events(events: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(urn, type, inputs) of every custom resource the stack has after the previewed update,
    unchanged ones included: what the policy rules judge."""
    out = {}
    for event in events:
        meta = (event.get("resourcePreEvent") or {}).get("metadata") or {}
        new = meta.get("new") or {}
        if new.get("custom") and ENGINE_OPS.get(str(meta.get("op"))) != DELETE:
            out[str(meta["urn"])] = (str(meta["urn"]), str(meta.get("type")), new.get("inputs") or {})
    return list(out.values())


# --- mocks: what the two revisions declare ---------------------------------------------------


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted paths of the inputs that differ (lists compared whole)."""
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def replace_keys(rtype: str, keys: Iterable[str]) -> tuple[str, ...]:
    rules = REPLACED_ON_CHANGE.get(rtype, _K8S_DEFAULT if rtype.startswith("kubernetes:") else ())
    return tuple(k for k in keys if any(k == r or k.startswith(r + ".") for r in rules))


def _old_of(res: Res, base: Mapping[str, Res]) -> Res | None:
    """The base's resource this one is: same URN, or one of its aliases."""
    return next((base[u] for u in (res.urn, *res.aliases) if u in base), None)


def diff_declared(base: Recorded, head: Recorded) -> Plan:
    """What `pulumi up` of head would do to a stack deployed from base, judged from inputs."""
    old = {r.urn: r for r in base.resources}
    plan, matched = Plan(), set()
    for res in head.resources:
        prev = _old_of(res, old)
        if prev is None:
            plan.steps.append(Step(CREATE, res.urn, res.type, res.name, new=res.inputs, custom=res.custom))
            continue
        matched.add(prev.urn)
        keys = changed_keys(prev.inputs, res.inputs)
        forced = replace_keys(res.type, keys)
        if forced:
            plan.steps.append(
                Step(REPLACE, res.urn, res.type, res.name, forced, prev.inputs, res.inputs, res.custom)
            )
        elif keys:
            plan.steps.append(
                Step(UPDATE, res.urn, res.type, res.name, tuple(keys), prev.inputs, res.inputs, res.custom)
            )
        elif res.custom:
            plan.same.add(res.urn)
    for urn, res in old.items():
        if urn not in matched:
            plan.steps.append(Step(DELETE, urn, res.type, res.name, old=res.inputs, custom=res.custom))
    return plan
