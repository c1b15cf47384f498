"""Name grammars for nodes, because alert text is hostile until validated.

A node name reaches `scontrol`, the Kubernetes API and Ansible extra vars, so it must match the
intersection of what Kubernetes accepts for a Node (an RFC 1123 subdomain) and what Slurm accepts as
a NodeName without hostlist syntax (no brackets, commas or spaces). We accept the RFC 1123 *label*
form (lower-case alphanumerics and '-', at most 63 characters) plus dots between labels, capped at
253 characters, and reject everything else rather than trying to escape it.
"""

from __future__ import annotations

import re

from autoheal.errors import ValidationError

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
NODE_NAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
MAX_NODE_NAME = 253


def is_node_name(value: object) -> bool:
    """True when `value` is a string usable as both a Kubernetes Node and a Slurm NodeName."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NODE_NAME
        and NODE_NAME_RE.fullmatch(value) is not None
    )


def validate_node_name(value: object, field: str = "node") -> str:
    """Return `value` if it is a valid node name, else raise ValidationError naming `field`."""
    if isinstance(value, str) and is_node_name(value):
        return value
    raise ValidationError(
        f"{field}: {repr(value)[:80]} is not a valid node name (lower-case letters, digits, '-' and '.', "
        f"starting and ending alphanumeric, at most {MAX_NODE_NAME} characters)"
    )
