# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""Action plugin autoheal.cluster.runbook_inputs: the first step of every runbook play.

It validates the play's inputs against their argument spec (as ansible.builtin.validate_argument_spec
does), fills in the spec's defaults, checks node names and incident ids, makes path inputs
absolute from the directory ansible-playbook was started in, and publishes the result as the fact
`autoheal_run`. It runs in the controller process, whose working directory is the engineer's.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.autoheal.cluster.plugins.plugin_utils.runbook_inputs import InputError, check_inputs


class ActionModule(ActionBase):  # type: ignore[misc]  # ansible ships no type information
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("argument_spec",))
    _requires_connection = False

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        task_vars = task_vars or {}
        result: dict[str, Any] = super().run(tmp, task_vars)
        spec = self._task.args.get("argument_spec")
        if not isinstance(spec, dict):
            return dict(result, failed=True, msg="argument_spec: give the play's entry of specs/inputs.yml")
        given = self._templar.template({name: task_vars[name] for name in spec if name in task_vars})
        try:
            run = check_inputs(spec, given, os.getcwd(), task_vars.get("playbook_dir", ""), os.environ)
        except InputError as exc:
            return dict(result, failed=True, msg=str(exc))
        return dict(result, changed=False, ansible_facts=dict(autoheal_run=run))
