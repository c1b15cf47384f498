# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The incident journal's line format, shared by the journal module and its action plugin: one
format, one validation."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

PHASE_CHARS = set("abcdefghijklmnopqrstuvwxyz_")
# the journal module's options, also checked by its action plugin
ARGUMENT_SPEC: dict[str, Any] = dict(
    path=dict(type="path", required=True),
    events=dict(type="list", elements="dict", required=True),
)


def build_lines(events: Iterable[dict[str, Any]], now: float) -> list[str]:
    """JSON lines for `events`; raises ValueError naming the bad event and key."""
    lines = []
    for ev in events:
        ev = dict(ev)
        for key in ("incident", "node", "phase"):
            if not isinstance(ev.get(key), str) or not ev[key]:
                raise ValueError(f"event {ev!r}: {key} must be a non-empty string")
        if not set(ev["phase"]) <= PHASE_CHARS:
            raise ValueError(f"event phase {ev['phase']!r}: lower-case letters and _ only")
        ev.setdefault("status", "ok")
        ts = ev.get("ts")
        ev["ts"] = float(ts) if ts not in (None, "") else now
        lines.append(json.dumps(ev, sort_keys=True, separators=(",", ":")))
    return lines


def append(path: str, lines: list[str]) -> None:
    """One write and one fsync for the batch, so a reader tailing the file sees whole lines."""
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
