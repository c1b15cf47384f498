#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

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
  - >-
    An action plugin of the same name does the write in the controller process (the journal is
    the runner's local file), which saves a module fork per phase - the phase timestamps then
    follow the step they record by milliseconds, not seconds.
version_added: 0.1.0
author: autoheal maintainers (@autoheal-project)
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
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.action
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

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.journal import (
    ARGUMENT_SPEC,
    append,
    build_lines,
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        lines = build_lines(module.params["events"], time.time())
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode or not lines:
        module.exit_json(changed=False, written=0)
    append(module.params["path"], lines)
    module.exit_json(changed=False, written=len(lines))


if __name__ == "__main__":
    main()
