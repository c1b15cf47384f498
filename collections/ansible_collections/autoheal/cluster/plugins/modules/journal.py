#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: journal
short_description: Append incident phase events as JSON lines (one write for a batch)
description:
  - >-
    Appends one JSON object per event to O(path) - keys incident, node, phase, status
    (ok, failed or skipped), ts (epoch seconds) and any extra keys - flushed and fsynced in one
    write, so the runner that tails the file sees whole lines only.
  - A journal is a record, not managed state - the task reports C(changed=false). In check mode
    nothing is written.
version_added: 0.1.0
author: autoheal maintainers
options:
  path:
    description: The journal file (created with mode 0640 when missing; its directory must exist).
    type: path
    required: true
  events:
    description:
      - Events to append; C(ts) defaults to now, C(status) to C(ok). Other keys are kept
        (e.g. C(detail)).
    type: list
    elements: dict
    required: true
attributes:
  check_mode:
    support: full
"""

EXAMPLES = r"""
- name: Record the fence
  autoheal.cluster.journal:
    path: "{{ autoheal_journal_events }}"
    events:
      - {incident: inc-42, node: gpu-3, phase: fenced, status: ok}
"""

RETURN = r"""
written:
  description: Number of lines appended (0 in check mode).
  returned: always
  type: int
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

PHASE_CHARS = set("abcdefghijklmnopqrstuvwxyz_")


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True),
                           events=dict(type="list", elements="dict", required=True)),
        supports_check_mode=True,
    )
    now = time.time()
    lines = []
    for ev in module.params["events"]:
        ev = dict(ev)
        for key in ("incident", "node", "phase"):
            if not isinstance(ev.get(key), str) or not ev[key]:
                module.fail_json(msg="event %r: %s must be a non-empty string" % (ev, key))
        if not set(ev["phase"]) <= PHASE_CHARS:
            module.fail_json(msg="event phase %r: lower-case letters and _ only" % ev["phase"])
        ev.setdefault("status", "ok")
        ts = ev.get("ts")
        ev["ts"] = float(ts) if ts not in (None, "") else now
        lines.append(json.dumps(ev, sort_keys=True, separators=(",", ":")))
    if module.check_mode or not lines:
        module.exit_json(changed=False, written=0)
    data = ("\n".join(lines) + "\n").encode("utf-8")
    fd = os.open(module.params["path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    module.exit_json(changed=False, written=len(lines))


if __name__ == "__main__":
    main()
