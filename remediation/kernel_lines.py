"""The XID watcher's kernel lines of a run's incidents, handed to the play as a file.

The watcher's alert carries the driver's kernel record (`kernel_line`, sanitised and bounded);
the intake keeps it in the incident's `alert_facts` timeline entries. Before a run, the runner
writes the lines of the batch's incidents to `<run dir>/kernel-lines.json` and passes only that
file's path (`autoheal_kernel_lines`): alert text never travels as an extra var, where Ansible
could template it. The evidence module reads the file and puts the lines into the bundle
(docs/runbook.md, "Evidence for the vendor").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from autoheal.xid_messages import MAX_LINE, sanitise
from remediation.journal import Journal

FILE = "kernel-lines.json"
FACTS_PHASE = "alert_facts"  # the intake's timeline entry of what an alert said
MAX_LINES = 100  # lines of one incident (its alerts' first sightings)
# what a driver line looks like: a kernel_line that is not one is not kept (anyone can post alerts)
DRIVER_LINE = re.compile(r"NVRM: |nvidia-nvswitch[0-9]{1,3}: SXid")


def kernel_line(raw: str) -> str:
    """A kernel line as the runner keeps it: sanitised, bounded, and a driver's line ("" if not)."""
    line = sanitise(raw, MAX_LINE)
    return line if DRIVER_LINE.search(line) else ""


def stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lines_of(journal: Journal, incident_id: str) -> list[str]:
    """The incident's kernel lines, oldest first, each prefixed with when the kernel logged it."""
    out: list[str] = []
    for entry in journal.timeline(incident_id):
        if entry.phase != FACTS_PHASE or not entry.detail:
            continue
        try:
            facts = json.loads(entry.detail)
        except ValueError:
            continue
        line = kernel_line(str(facts.get("kernel_line", ""))) if isinstance(facts, dict) else ""
        if line:
            at = facts.get("logged_at")
            out.append(f"{stamp(at if isinstance(at, int | float) else entry.ts)} {line}")
    return out[-MAX_LINES:]


def write(path: Path, lines: Mapping[str, Iterable[str]]) -> Path:
    """Write {"nodes": {node: [line]}} to `path` whole (a rename), readable by the runner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"nodes": {n: list(ls) for n, ls in lines.items()}}, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def write_for_run(journal: Journal, run_dir: Path, batch: Iterable[tuple[str, str]]) -> Path:
    """The file for a run of `batch` ((node, incident id) pairs); returns its path."""
    return write(run_dir / FILE, {node: lines_of(journal, iid) for node, iid in batch})
