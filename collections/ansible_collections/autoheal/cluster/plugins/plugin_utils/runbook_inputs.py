# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)
"""The runbooks' inputs after their types are checked: node names and incident ids against their
grammars, paths made absolute from the directory the engineer started the play in, and what every
step derives from them. Controller side only (the action plugin autoheal.cluster.runbook_inputs);
pure functions, so tests call them directly.

Why paths are resolved here: modules run in a directory of their own, so a relative
`autoheal_slurm_conf` handed to a module is read from the wrong place. The play's first step runs
in the controller process, whose working directory is the engineer's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.autoheal.cluster.plugins.module_utils.validate import (
    INCIDENT_ID_RE,
    NODE_NAME_RE,
    is_incident_id,
    is_node_name,
    shown,
)

PREFIX = "autoheal_"
# path inputs: those that must name an existing file, and those whose folder must exist
FILE_INPUTS = ("autoheal_slurm_conf", "autoheal_kubeconfig", "autoheal_lab_token_file")
NEW_FILE_INPUTS = ("autoheal_journal_events", "autoheal_signal_ledger")
DIR_INPUTS = ("autoheal_lab_root",)
NEW_DIR_INPUTS = ("autoheal_evidence_dir",)  # made absolute; the step that writes there creates it
LAB_ROOT_ENV = "AUTOHEAL_LAB_ROOT"
MANUAL = "manual"  # the incident of a node given without one
# the lab's pool API from a pod (autoheal_lab_url): http(s), a host, an optional port and path
LAB_URL_RE = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?")


class InputError(ValueError):
    """An input is wrong; the message names it and says how to fix it."""


def check_names(nodes: list[str], incident_ids: list[str], required: bool = True) -> None:
    bad = [n for n in nodes if not is_node_name(n)]
    if bad:
        raise InputError(
            f"autoheal_nodes: {shown(bad)} not node names (they must match {NODE_NAME_RE.pattern}, "
            "lower-case, at most 253 characters)"
        )
    if not nodes and required:
        raise InputError("autoheal_nodes: give at least one node")
    repeated = sorted({n for n in nodes if nodes.count(n) > 1})
    if repeated:
        raise InputError(f"autoheal_nodes: {shown(repeated)} given twice")
    bad = [i for i in incident_ids if not is_incident_id(i)]
    if bad:
        raise InputError(f"autoheal_incident_ids: {shown(bad)} must match {INCIDENT_ID_RE.pattern}")
    if len(incident_ids) > len(nodes):
        raise InputError("autoheal_incident_ids: more incident ids than nodes (they pair up in order)")


def resolve_path(name: str, value: str, cwd: str) -> str:
    """`value` made absolute against `cwd`, checked for what the input needs."""
    if not value:
        return ""
    path = os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))
    where = "" if os.path.isabs(os.path.expanduser(value)) else f" (relative paths are read from {cwd})"
    if name in FILE_INPUTS and not os.path.isfile(path):
        raise InputError(
            f"{name}: {value} does not exist{where}; give the path of the file, e.g. an absolute one"
        )
    if name in NEW_FILE_INPUTS and not os.path.isdir(os.path.dirname(path)):
        raise InputError(
            f"{name}: the folder of {value} does not exist{where}; create it or give another path"
        )
    if name in DIR_INPUTS and not os.path.isdir(path):
        raise InputError(f"{name}: {value} is not a folder{where}; give an existing folder")
    return path


def default_lab_root(env: Mapping[str, str], playbook_dir: str) -> str:
    """Where `autoheal lab` keeps its labs: $AUTOHEAL_LAB_ROOT, else .lab beside playbooks/."""
    return env.get(LAB_ROOT_ENV) or os.path.normpath(os.path.join(playbook_dir, os.pardir, ".lab"))


def derive(
    values: dict[str, Any], cwd: str, playbook_dir: str, env: Mapping[str, str], nodes_required: bool = True
) -> dict[str, Any]:
    """`autoheal_run`: every input without its prefix, paths absolute, plus what the steps derive
    (incidents per node, whether Kubernetes is in play, the effective replacement backend)."""
    values = dict(values)
    nodes = list(values.get("autoheal_nodes") or [])
    ids = list(values.get("autoheal_incident_ids") or [])
    check_names(nodes, ids, nodes_required)
    if "autoheal_lab_root" in values and not values["autoheal_lab_root"]:
        values["autoheal_lab_root"] = default_lab_root(env, playbook_dir)
        if not os.path.isdir(values["autoheal_lab_root"]):
            values["autoheal_lab_root"] = ""  # no lab here: only the lab backend needs it
    for name in (*FILE_INPUTS, *NEW_FILE_INPUTS, *DIR_INPUTS, *NEW_DIR_INPUTS):
        if name in values:
            values[name] = resolve_path(name, str(values[name] or ""), cwd)
    run = {key[len(PREFIX) :] if key.startswith(PREFIX) else key: value for key, value in values.items()}
    incidents = {n: ids[i] if i < len(ids) else MANUAL for i, n in enumerate(nodes)}
    lab_url = str(run.get("lab_url") or "")
    if lab_url and not LAB_URL_RE.fullmatch(lab_url):
        raise InputError(f"autoheal_lab_url: {shown(lab_url)} is not an http(s) URL of a lab's pool API")
    backend = run.get("backend") or ("lab" if run.get("lab_name") or lab_url else "none")
    run.update(
        nodes=nodes,
        incidents=incidents,
        incident_list=[incidents[n] for n in nodes],
        use_kube=bool(run.get("kubeconfig")),
        backend=backend,
        lab_args=lab_args(run),
    )
    if backend == "lab" and not lab_url and not run.get("lab_root"):
        raise InputError(
            f"autoheal_lab_root: no lab folder found (looked at ${LAB_ROOT_ENV} and .lab beside playbooks/); "
            "give the folder holding the lab, autoheal_lab_url, or autoheal_backend=none"
        )
    return run


def check_inputs(
    spec: dict[str, Any], given: dict[str, Any], cwd: str, playbook_dir: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """The first step of a runbook play, as one function for both who run it (the action plugin
    autoheal.cluster.runbook_inputs, and the runner's warm fence through plugin_utils/warm_fence):
    `given` checked against the play's argument spec (as ansible.builtin.validate_argument_spec
    does, defaults filled in), then `autoheal_run` derived. Raises InputError naming what is wrong."""
    # imported here: the rest of this file is pure and its tests need no Ansible
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    checked = ArgumentSpecValidator(spec).validate(given, validate_role_argument_spec=True)
    if checked.error_messages:
        raise InputError("invalid input: " + "; ".join(checked.error_messages))
    # a play whose spec does not require nodes (slurm_rollout: every stale node) may get none
    nodes_spec = spec.get("autoheal_nodes")
    nodes_required = nodes_spec is None or bool(nodes_spec.get("required", False))
    return derive(checked.validated_parameters, cwd, playbook_dir, env, nodes_required)


def lab_args(run: Mapping[str, Any]) -> list[str]:
    """How the lab backend's `autoheal lab pool ...` calls name their lab: by its pool API's URL
    and a token file (a runner in a pod, where the lab's files are not), else by name and folder."""
    if run.get("lab_url"):
        token = run.get("lab_token_file") or ""
        return ["--url", str(run["lab_url"])] + (["--token-file", str(token)] if token else [])
    root = run.get("lab_root") or ""
    return ["--name", str(run.get("lab_name") or "")] + (["--root", str(root)] if root else [])
