"""The watcher's memory across restarts: where it stopped reading, and what it has not delivered.

One small JSON file, replaced atomically (write, fsync, rename), so a crash leaves either the old
or the new state, never half of one. Saving the cursor and the outbox together is what makes a
restart safe both ways: lines before the cursor are not posted again, and alerts taken from them
but not yet accepted by Alertmanager are still in the outbox.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
VERSION = 1


def load(path: Path, node: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(cursor, outbox entries) from `path`; (None, []) when there is none or it is unusable (a
    state written for another node, an older format, a corrupt file: logged, then ignored)."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None, []
    except (OSError, ValueError) as exc:
        log.warning("state %s unreadable (%s): starting without it", path, exc)
        return None, []
    if not isinstance(raw, dict) or raw.get("version") != VERSION or raw.get("node") != node:
        log.warning("state %s is not a version-%d state of node %s: starting without it", path, VERSION, node)
        return None, []
    cursor = raw.get("cursor")
    outbox = raw.get("outbox")
    return (cursor if isinstance(cursor, dict) else None), (outbox if isinstance(outbox, list) else [])


def save(path: Path, node: str, cursor: dict[str, Any] | None, outbox: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps({"version": VERSION, "node": node, "cursor": cursor, "outbox": outbox})
    with tmp.open("w") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
