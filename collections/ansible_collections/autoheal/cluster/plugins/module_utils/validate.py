# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Input checks shared by the modules and the controller-side plugins: alert text is hostile until
validated, so a node name, a reason or an incident id that does not match its grammar is refused
rather than escaped. The node-name grammar is the core's (module_utils/contract.py is generated
from autoheal/names.py)."""

from __future__ import annotations

import re
from typing import Any, Iterable

from ansible_collections.autoheal.cluster.plugins.module_utils.contract import (
    MAX_NODE_NAME,
    NODE_NAME_PATTERN,
)

NODE_NAME_RE = re.compile(NODE_NAME_PATTERN)
# A reason or comment reaches scontrol as one argv element; still keep it to printable, single-line
# text so it can never be mistaken for another scontrol keyword or break `scontrol show -o`.
TEXT_RE = re.compile(r"[A-Za-z0-9 _.,:;/+()#@%=\-\[\]]{1,240}")
TEXT_CHARS = "[A-Za-z0-9 _.,:;/+()#@%=-[]]"
# The runner's ids (inc-..., man-...) and the names an engineer types for a manual run.
INCIDENT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def is_node_name(value: object) -> bool:
    """True when `value` is usable as both a Kubernetes Node and a Slurm NodeName."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= MAX_NODE_NAME
        and NODE_NAME_RE.fullmatch(value) is not None
    )


def is_text(value: object) -> bool:
    """True for a single-line reason or comment of the allowed characters."""
    return isinstance(value, str) and TEXT_RE.fullmatch(value) is not None


def is_incident_id(value: object) -> bool:
    return isinstance(value, str) and INCIDENT_ID_RE.fullmatch(value) is not None


def unique(values: Iterable[str]) -> list[str]:
    """`values` without repeats, first occurrence kept (order matters for parallel lists)."""
    seen: dict[str, None] = {}
    for value in values:
        seen.setdefault(value, None)
    return list(seen)


def shown(values: Iterable[object]) -> str:
    """A short, quoted list of bad values for an error message (hostile text stays quoted)."""
    return ", ".join(repr(v)[:80] for v in list(values)[:10])


def validate_nodes(module: Any, nodes: Iterable[object], field: str = "nodes") -> list[str]:
    """Fail the module unless every entry is a valid node name; return them without repeats."""
    values = list(nodes)
    bad = [n for n in values if not is_node_name(n)]
    if bad:
        module.fail_json(msg=f"{field}: invalid node name(s): {shown(bad)}")
    return unique(str(n) for n in values)


def validate_text(module: Any, value: str | None, field: str) -> str | None:
    """Fail the module unless `value` (when given) is safe single-line text; return it."""
    if value is not None and not is_text(value):
        module.fail_json(msg=f"{field}: {value[:80]!r} has characters outside {TEXT_CHARS} or is too long")
    return value
