# -*- coding: utf-8 -*-
# Shared by the journal module and its action plugin: one format, one validation.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

PHASE_CHARS = set("abcdefghijklmnopqrstuvwxyz_")


def build_lines(events, now):
    """JSON lines for `events`; raises ValueError naming the bad event and key."""
    lines = []
    for ev in events:
        ev = dict(ev)
        for key in ("incident", "node", "phase"):
            if not isinstance(ev.get(key), str) or not ev[key]:
                raise ValueError("event %r: %s must be a non-empty string" % (ev, key))
        if not set(ev["phase"]) <= PHASE_CHARS:
            raise ValueError("event phase %r: lower-case letters and _ only" % ev["phase"])
        ev.setdefault("status", "ok")
        ts = ev.get("ts")
        ev["ts"] = float(ts) if ts not in (None, "") else now
        lines.append(json.dumps(ev, sort_keys=True, separators=(",", ":")))
    return lines


def append(path, lines):
    """One write and one fsync for the batch, so a reader tailing the file sees whole lines."""
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
