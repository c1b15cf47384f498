# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Action plugin for autoheal.cluster.journal: append the events in the controller process.

Plays run on localhost and the journal is the runner's own file, so there is nothing to ship to a
host; skipping the module fork (Python start + AnsiballZ) takes a journal task from ~1 s to ms.
"""

from __future__ import annotations

import time
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.autoheal.cluster.plugins.module_utils.journal import (
    ARGUMENT_SPEC,
    append,
    build_lines,
)


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result: dict[str, Any] = super().run(tmp, task_vars)
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
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
            result.update(failed=True, msg=f"journal {args['path']}: {exc}")
            return result
        result.update(changed=False, written=len(lines))
        return result
