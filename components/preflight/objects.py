"""Small helpers over API objects as plain JSON (nodes, taints, label selectors, versions) and
the way a row lists what it names."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from autoheal.labels import GPU_RESOURCE
from components.config import TaintSpec


def name_of(obj: Mapping[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", "?"))


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj.get("metadata", {}).get("labels") or {})


def listed(items: Iterable[str], limit: int = 5) -> str:
    """Names in a row: sorted, at most `limit` of them, and how many more."""
    items = sorted(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def is_ready(node: Mapping[str, Any]) -> bool:
    conds = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _quantity(value: Any) -> int:
    """An integer quantity (a count of GPUs); anything else counts as none."""
    try:
        return int(str(value))
    except ValueError:
        return 0


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("191450m", "2048Gi", 8) as a number; unparsable counts as none."""
    from kubernetes.utils.quantity import parse_quantity

    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError):
        return Decimal(0)


def gpus_of(node: Mapping[str, Any]) -> int:
    return _quantity((node.get("status", {}).get("allocatable") or {}).get(GPU_RESOURCE, 0))


def tolerates(tolerations: Sequence[TaintSpec], taint: Mapping[str, Any]) -> bool:
    """Whether one of `tolerations` (as the components write them) tolerates `taint`: a key
    without a value is tolerated with `Exists`, one with a value with `Equal`; effects match."""
    for t in tolerations:
        if t.key != taint.get("key") or t.effect != taint.get("effect"):
            continue
        if t.value is None or t.value == taint.get("value"):
            return True
    return False


def blocking_taints(taints: Iterable[Mapping[str, Any]], tolerations: Sequence[TaintSpec]) -> list[str]:
    """The taints that keep a pod with `tolerations` off a node (PreferNoSchedule does not)."""
    return [
        _taint_text(t)
        for t in taints
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, t)
    ]


def _taint_text(t: Mapping[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions) against labels; None matches
    nothing here (the caller decides what an absent selector means)."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a Kubernetes version such as v1.31.2-eks-1234; None if it is not one."""
    m = re.match(r"^v?(\d+)\.(\d+)", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def version_text(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"
