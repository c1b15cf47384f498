"""Which replacements and deletions lose state, and the approval they need to pass review.

Replacing or deleting one of these is not a rollout: the Slurm controller's state volume holds the
job queue and the node states the runbook set, the runner's journal volume holds every incident,
a node pool holds the GPU nodes running training jobs, a namespace takes every volume claim in it
along, and a regenerated secret (the munge key, the login host key) locks out every running
slurmd or every user's known_hosts. Such a step fails the review unless the change carries an
approval marker naming the resource (`Autoheal-Approve: <logical name>` in a commit message, or
`--approve <name>`; `all` approves every one).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from autoheal import labels as lb
from review.plan import DELETE, REPLACE, Plan, Step

APPROVE_ALL = "all"


@dataclass(frozen=True)
class Flag:
    step: Step
    what: str  # what would be lost, in words
    approved: bool


def _labels(inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = inputs.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    return labels if isinstance(labels, Mapping) else {}


def _k8s_name(inputs: Mapping[str, Any]) -> str:
    meta = inputs.get("metadata")
    return str(meta.get("name")) if isinstance(meta, Mapping) else "?"


def stateful_what(rtype: str, inputs: Mapping[str, Any]) -> str | None:
    """What a replacement or deletion of this resource would lose; None if nothing lasting."""
    component = _labels(inputs).get(lb.COMPONENT_LABEL)
    name = _k8s_name(inputs)
    if rtype == "kubernetes:apps/v1:StatefulSet":
        if component == lb.SLURMCTLD_COMPONENT:
            return "the Slurm controller's state volume (job queue, node states)"
        spec = inputs.get("spec")
        if isinstance(spec, Mapping) and spec.get("volumeClaimTemplates"):
            return f"the volumes of StatefulSet {name}"
    if rtype == "kubernetes:core/v1:PersistentVolumeClaim":
        if component == lb.RUNNER_COMPONENT:
            return "the runner's incident journal volume"
        return f"volume claim {name} and its data"
    if rtype == "kubernetes:core/v1:Namespace":
        return f"namespace {name}, with every volume claim in it"
    if rtype == "kubernetes:core/v1:ConfigMap" and component == lb.NODE_POOL_COMPONENT:
        return f"GPU node pool {_labels(inputs).get(lb.POOL_LABEL, name)} (its nodes are retired)"
    if rtype == "aws:eks/nodeGroup:NodeGroup":
        return f"EKS node group {inputs.get('nodeGroupName', '?')}: every GPU node of the pool"
    if rtype == "aws:efs/fileSystem:FileSystem":
        return "the EFS file system behind the shared volumes (home, checkpoints): every file on it"
    if rtype == "aws:eks/cluster:Cluster":
        return "the EKS control plane and everything running on it"
    if rtype == "pulumi-python:dynamic:Resource":
        return "a generated secret (munge key: every slurmd must restart; host key: users' known_hosts)"
    return None


def is_approved(step: Step, approvals: Collection[str]) -> bool:
    return APPROVE_ALL in approvals or step.name in approvals or step.urn in approvals


def stateful_flags(plan: Plan, approvals: Collection[str]) -> list[Flag]:
    """Every replacement or deletion in the plan that loses state, and whether it is approved."""
    flags = []
    for step in plan.steps:
        if step.op not in (REPLACE, DELETE) or not step.custom:
            continue
        what = stateful_what(step.type, step.inputs)
        if what is not None:
            flags.append(Flag(step, what, is_approved(step, approvals)))
    return flags
