# -*- coding: utf-8 -*-
# Action plugin for autoheal.cluster.journal: append the events in the controller process.
# Plays run on localhost and the journal is the runner's own file, so there is nothing to ship to a
# host; skipping the module fork (Python start + AnsiballZ) takes a journal task from ~1 s to ms.
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase
from ansible_collections.autoheal.cluster.plugins.module_utils.journal import append, build_lines


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("path", "events"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _, args = self.validate_argument_spec(
            argument_spec=dict(path=dict(type="path", required=True),
                               events=dict(type="list", elements="dict", required=True)),
        )
        try:
            lines = build_lines(args["events"], time.time())
        except ValueError as exc:
            result.update(failed=True, msg=str(exc))
            return result
        if self._task.check_mode or not lines:
            result.update(changed=False, written=0)
            return result
        try:
            append(args["path"], lines)
        except OSError as exc:
            result.update(failed=True, msg="journal %s: %s" % (args["path"], exc))
            return result
        result.update(changed=False, written=len(lines))
        return result
