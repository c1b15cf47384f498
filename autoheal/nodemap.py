"""Which Slurm node a Kubernetes node is, by a declared rule, for a Slurm autoheal did not deploy.

autoheal's own slurmd pods name their Slurm node after the Kubernetes node. A Slurm run by
someone else need not: SchedMD's Slinky operator names a NodeSet's nodes after the Kubernetes node
in DaemonSet mode, but `<nodeset>-<ordinal>` (the pod's hostname) in StatefulSet mode, where the
Kubernetes node is found only through the pod. So the rule is declared (`slurm.node_map.rule`):

- `same`: the Slurm node has the Kubernetes node's name (autoheal's pods, Slinky's DaemonSet mode).
- `pod-hostname`: the hostname of the slurmd pod scheduled on the node (`spec.hostname`, else the
  pod's name, which a StatefulSet pod's hostname is), the pods chosen by `slurm.node_map.selector`.
- `annotation`: the node's annotation `slurm.node_map.annotation` holds the Slurm name.

A node that maps to no Slurm node, or ambiguously (two slurmd pods on it, two nodes claiming one
Slurm name, a name Slurm does not have), is reported with the reason and left out: a wrong guess
would drain someone else's node. Everything here is pure: the caller lists nodes and pods.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from autoheal.errors import ConfigError
from autoheal.names import is_node_name

Rule = Literal["same", "pod-hostname", "annotation"]
RULES: tuple[Rule, ...] = ("same", "pod-hostname", "annotation")
SETTING = "slurm.node_map"

_KEY = r"(?:[a-z0-9A-Z.-]+/)?[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_TERM = re.compile(rf"^\s*(?:(!)\s*({_KEY})|({_KEY})\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)|({_KEY}))\s*$")


@dataclass(frozen=True)
class NodeMapRule:
    """The declared rule; `check()` raises a ConfigError naming the field when it is incomplete."""

    rule: Rule = "same"
    selector: str = ""  # pod-hostname: the slurmd pods' label selector (`app.kubernetes.io/name=slurmd`)
    annotation: str = ""  # annotation: the node annotation that holds the Slurm name

    def check(self) -> NodeMapRule:
        if self.rule not in RULES:
            raise ConfigError(f"{SETTING}.rule: one of {', '.join(RULES)} (got {self.rule!r})")
        if self.rule == "pod-hostname":
            if not self.selector:
                raise ConfigError(
                    f"{SETTING}.selector: rule pod-hostname needs the slurmd pods' label selector "
                    "(e.g. app.kubernetes.io/name=slurmd)"
                )
            parse_selector(self.selector)
        if self.rule == "annotation" and not re.fullmatch(_KEY, self.annotation or ""):
            raise ConfigError(
                f"{SETTING}.annotation: rule annotation needs the annotation key that holds the Slurm "
                f"node name (e.g. example.org/slurm-node; got {self.annotation!r})"
            )
        return self


def parse_selector(text: str) -> list[tuple[str, str, str]]:
    """An equality-based label selector (`a=b,c!=d,e,!f`) as (op, key, value) terms; a term that
    is not one is a ConfigError naming the selector field."""
    terms = []
    for part in text.split(","):
        m = _TERM.match(part)
        if not m:
            raise ConfigError(
                f"{SETTING}.selector: {part.strip()!r} is not a label selector term "
                "(key=value, key!=value, key or !key)"
            )
        if m.group(1):
            terms.append(("!", m.group(2), ""))
        elif m.group(3):
            terms.append(("!=" if m.group(4) == "!=" else "=", m.group(3), m.group(5)))
        else:
            terms.append(("exists", m.group(6), ""))
    return terms


def selector_matches(text: str, labels: Mapping[str, str]) -> bool:
    for op, key, value in parse_selector(text):
        if (
            (op == "=" and labels.get(key) != value)
            or (op == "!=" and labels.get(key) == value)
            or (op == "exists" and key not in labels)
            or (op == "!" and key in labels)
        ):
            return False
    return True


@dataclass(frozen=True)
class NodeMap:
    """Kubernetes node -> Slurm node, and the nodes left out with the reason."""

    mapped: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)

    def slurm_name(self, kube_node: str) -> str | None:
        return self.mapped.get(kube_node)

    def kube_name(self, slurm_node: str) -> str | None:
        return next((k for k, s in self.mapped.items() if s == slurm_node), None)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _pod_names(rule: NodeMapRule, pods: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Kubernetes node -> the Slurm names of the selected slurmd pods on it (not ended ones)."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        meta, spec = _meta(pod), pod.get("spec") or {}
        phase = (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            continue
        if not selector_matches(rule.selector, meta.get("labels") or {}):
            continue
        out.setdefault(str(spec["nodeName"]), []).append(str(spec.get("hostname") or meta.get("name") or ""))
    return out


def _candidate(
    rule: NodeMapRule, node: Mapping[str, Any], by_pod: Mapping[str, list[str]]
) -> tuple[str | None, str]:
    """(the Slurm name the rule gives, or None with why)."""
    name = str(_meta(node).get("name") or "")
    if rule.rule == "same":
        return name, ""
    if rule.rule == "annotation":
        value = (_meta(node).get("annotations") or {}).get(rule.annotation)
        if not value:
            return None, f"no annotation {rule.annotation}"
        return str(value).strip(), ""
    found = by_pod.get(name, [])
    if not found:
        return None, f"no slurmd pod ({rule.selector}) on it"
    if len(found) > 1:
        return None, f"{len(found)} slurmd pods ({rule.selector}) on it: {', '.join(sorted(found))}"
    return found[0], ""


def map_nodes(
    rule: NodeMapRule,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]] = (),
    slurm_nodes: Iterable[str] | None = None,
) -> NodeMap:
    """Map every Node (API objects as JSON) by `rule`; `pods` for pod-hostname; `slurm_nodes`
    (the names Slurm has), when given, leaves out a name Slurm does not know. Never guesses."""
    by_pod = _pod_names(rule, pods) if rule.rule == "pod-hostname" else {}
    known = set(slurm_nodes) if slurm_nodes is not None else None
    picked: dict[str, str] = {}
    unmapped: dict[str, str] = {}
    for node in nodes:
        kube = str(_meta(node).get("name") or "")
        slurm, why = _candidate(rule, node, by_pod)
        if slurm is None:
            unmapped[kube] = why
        elif not is_node_name(slurm):
            unmapped[kube] = f"{slurm!r} is not a node name Slurm and Kubernetes both accept"
        elif known is not None and slurm not in known:
            unmapped[kube] = f"Slurm has no node {slurm} (rule {rule.rule})"
        else:
            picked[kube] = slurm
    claims: dict[str, list[str]] = {}
    for kube, slurm in picked.items():
        claims.setdefault(slurm, []).append(kube)
    mapped = {}
    for slurm, kubes in claims.items():
        if len(kubes) == 1:
            mapped[kubes[0]] = slurm
            continue
        for kube in kubes:  # two Kubernetes nodes claim one Slurm node: neither is trusted
            unmapped[kube] = (
                f"Slurm node {slurm} is claimed by {len(kubes)} nodes: {', '.join(sorted(kubes))}"
            )
    return NodeMap(mapped, unmapped)
