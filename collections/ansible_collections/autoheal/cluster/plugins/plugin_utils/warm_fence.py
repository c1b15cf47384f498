# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""What the runner's warm fence (remediation/warmfence.py) takes from this collection, in one place.

The warm fence runs the runbook's fence step without a play's start-up; for it to do what the play
does, it uses the play's own code, and this module is all of it: the one module of the collection
that code outside the collection imports (pyproject.toml's layer contracts see the collection and
allow that one import, from remediation.warmfence).

- `check_inputs`: the play's first step (the action plugin autoheal.cluster.runbook_inputs runs the
  same function): the inputs checked against the play's argument spec, `autoheal_run` derived.
- `record_fenced`: the `fenced` journal events of a fence result, written as the play's
  "Journal - fenced" step writes them (the fence_events filter, the journal action's line format).
- `run_module`: a module of this collection run in this process the way Ansible runs a module file
  by hand (`python -m ansible_collections.autoheal.cluster.plugins.modules.NAME ARGS_FILE`): its
  arguments in a JSON file named on the command line. No private name of Ansible's is set.

Controller side only (plugin_utils): it runs where the runner or ansible-playbook runs.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from ansible_collections.autoheal.cluster.plugins.filter.journal_events import fence_events
from ansible_collections.autoheal.cluster.plugins.module_utils.journal import append, build_lines
from ansible_collections.autoheal.cluster.plugins.plugin_utils.runbook_inputs import InputError, check_inputs

__all__ = [
    "FENCE_MODULE",
    "MODULES",
    "REQUEUE_MODULE",
    "InputError",
    "check_inputs",
    "import_modules",
    "record_fenced",
    "run_module",
]

PACKAGE = "ansible_collections.autoheal.cluster.plugins.modules"
# the modules the warm fence runs, by the name a playbook task calls them
FENCE_MODULE = "autoheal.cluster.fence"
REQUEUE_MODULE = "autoheal.cluster.slurm_jobs"
MODULES = (FENCE_MODULE, REQUEUE_MODULE)


def _short(fqcn: str) -> str:
    if fqcn not in MODULES:
        raise ValueError(f"{fqcn}: the warm fence runs {', '.join(MODULES)} only")
    return fqcn.rsplit(".", 1)[1]


def import_modules() -> None:
    """Import the modules once, in the long-lived process, so the child that runs one starts warm."""
    for fqcn in MODULES:
        importlib.import_module(f"{PACKAGE}.{_short(fqcn)}")


def run_module(fqcn: str, args: Mapping[str, Any]) -> int:
    """Run module `fqcn` with `args` in this process; returns its exit code. The module prints its
    JSON result on stdout and ends with sys.exit, as it does under Ansible: call this in a child
    process of its own (the warm fence forks one per module run)."""
    module = importlib.import_module(f"{PACKAGE}.{_short(fqcn)}")
    fd, path = tempfile.mkstemp(prefix="autoheal-module-args-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"ANSIBLE_MODULE_ARGS": dict(args)}, fh)
        # what `python -m <module> ARGS_FILE` gives the module: AnsibleModule reads its arguments
        # from the file named by argv[1] (profile "legacy", what ansible-core gives a collection)
        sys.argv = [module.__name__, path]
        try:
            module.main()
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else 1
        return 0
    finally:
        os.unlink(path)


def record_fenced(
    path: str, fence: Mapping[str, Any], incidents: Mapping[str, str], now: float
) -> list[dict[str, Any]]:
    """The `fenced` journal events of fence result `fence`, appended to the events file `path`
    (none when `path` is empty) as the play's journal step appends them; returns the events."""
    events = fence_events(fence, incidents)
    lines = build_lines(events, now)
    if path and lines:  # the journal action writes nothing for no events
        append(path, lines)
    return events
