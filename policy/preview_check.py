"""Apply the policy rules to `pulumi preview --json` output, without the policy-pack runtime.

`pulumi preview --policy-pack policy` is the normal way to run the pack. An engine whose Python
language host cannot start policy packs (the lab's minimal, offline-built host has no RunPlugin)
still produces the previewed resources as JSON (`--show-sames` lists the unchanged ones too);
this reads them (stdin or a file) and judges every resource's new inputs with the same rule
functions, so reviews are guarded either way.

    pulumi preview --json --show-sames | python -m policy.preview_check
Exit status: 0 compliant, 1 violations (listed), 2 unreadable input.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from policy.rules import judge


def resources_of(preview: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(urn, type, inputs) of every resource the stack will have after the preview's update."""
    out = []
    for step in preview.get("steps", []):
        if step.get("op") in {"delete", "discard", "remove-pending-replace"}:
            continue
        state = step.get("newState") or {}
        rtype = state.get("type") or step.get("urn", "::::").split("::")[2].split("$")[-1]
        out.append((str(step.get("urn", "")), str(rtype), state.get("inputs") or {}))
    return out


def violations(resources: Iterable[tuple[str, str, Mapping[str, Any]]]) -> list[str]:
    return [f"[{rule}] {urn + ': ' if urn else ''}{msg}" for rule, urn, msg in judge(resources)]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        text = open(args[0]).read() if args else sys.stdin.read()  # noqa: SIM115
        preview = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        print(f"policy check: cannot read the preview JSON: {exc}", file=sys.stderr)
        return 2
    resources = resources_of(preview)
    found = violations(resources)
    for line in found:
        print(f"VIOLATION {line}")
    print(f"policy check: {len(resources)} resources, {len(found)} violations")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
