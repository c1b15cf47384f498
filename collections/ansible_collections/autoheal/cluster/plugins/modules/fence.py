#!/usr/bin/python
# Copyright: autoheal maintainers
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: fence
short_description: Fence a batch of nodes in Slurm and Kubernetes at once, in one task
description:
  - >-
    Drains the nodes in Slurm with reasons autoheal owns (what M(autoheal.cluster.slurm_node) does
    with O(autoheal.cluster.slurm_node#module:state=drain)) and, at the same time, quarantines them
    in Kubernetes - cordon, the quarantine taint, the state label and the incident annotation (what
    M(autoheal.cluster.k8s_nodes) does for the k8s_node role's fence). Both halves run concurrently
    in one module process.
  - >-
    Why one module: the fence is the step between an alert and safety, and each Ansible module task
    costs ~0.4 s of Python start-up on top of its work; two tasks one after the other cost about
    twice the time of this one (measured, bench/mttr.py).
  - Both halves always run to completion; if either fails, the task fails with both results.
  - >-
    With O(signal_jobs), the jobs running on those nodes get O(signal) (SIGTERM) in the same step,
    concurrently with the drain, so they start their checkpoint at the fence instead of after the
    runbook's next steps (about 2.5 s later, measured with bench/mttr.py). The ids and the time go
    to M(autoheal.cluster.slurm_jobs) (its O(autoheal.cluster.slurm_jobs#module:signalled_job_ids)),
    which then only waits for each job to leave and requeues it. A failed signal does not fail the
    fence (it is reported; slurm_jobs signals what was not signalled).
  - >-
    Opted-out nodes keep their jobs - with O(kubernetes), a node labelled O(opt_out_label)=true,
    or running a live pod so labelled, is read first (concurrently with the drain) and not
    signalled; a node whose labels could not be read is not signalled either (C(unchecked) in RV(jobs)).
    The read is two lists by label selector (the labelled nodes, the labelled pods) whatever the
    batch's size, so a storm's opt-out check does not compete with its cordons for the API server.
  - An administrator's drain reason, and a cordon someone else set, are left alone (reported).
version_added: 0.2.0
author: autoheal maintainers (@autoheal-project)
options:
  reason:
    description: Slurm reason for every node (our prefix is added).
    type: str
  reasons:
    description: Per node Slurm reasons, overriding O(reason).
    type: dict
    default: {}
  reason_prefix:
    description: Prefix marking the reasons autoheal owns.
    type: str
    default: "autoheal: "
  incident_ids:
    description: Incident ids parallel to O(nodes), written into each node's incident annotation.
    type: list
    elements: str
    default: []
  tier:
    description: Value of the quarantine taint (the fault's tier).
    type: str
    default: replace
    choices: [notify, restart_app, reset, reboot, replace, quarantine]
  kubernetes:
    description: Quarantine in Kubernetes too; V(false) fences in Slurm only.
    type: bool
    default: true
  taint_key:
    description: Key of the quarantine taint.
    type: str
    default: autoheal.io/quarantine
  taint_effect:
    description:
      - Effect of the quarantine taint (NoSchedule lets PodDisruptionBudgets and the grace period rule).
    type: str
    default: NoSchedule
    choices: [NoSchedule, PreferNoSchedule, NoExecute]
  state_label:
    description: Label set to C(quarantined).
    type: str
    default: autoheal.io/state
  incident_annotation:
    description: Annotation holding the node's incident id.
    type: str
    default: autoheal.io/incident
  allow_missing:
    description: Do not fail on nodes unknown to Slurm or Kubernetes (they are reported).
    type: bool
    default: false
  verify_seconds:
    description: Seconds to wait for Slurm to show the drain.
    type: float
    default: 10
  signal_jobs:
    description:
      - Nodes whose running jobs get O(signal) in the same step (the runbook passes the nodes it
        will evacuate; never opted-out ones).
    type: list
    elements: str
    default: []
  opt_out_label:
    description:
      - Label (value C(true)) on a node, or on a pod running on it, that keeps its jobs from O(signal_jobs).
    type: str
    default: autoheal.io/opt-out
  signal:
    description: Signal for O(signal_jobs).
    type: str
    default: TERM
    choices: [TERM, INT, USR1, USR2]
  signal_ledger:
    description:
      - A file recording which jobs this run has signalled, and when (created when missing; its folder
        must exist). Jobs found in it are not signalled again but reported as signalled, with their
        time - also those that have left already, so their requeue is not lost.
      - The runbook passes one per run - the warm fence and the play's own fence step share it, so
        whichever comes first signals and the other does not signal twice.
      - Not read nor written in check mode.
    type: path
extends_documentation_fragment:
  - autoheal.cluster.attributes
  - autoheal.cluster.attributes.diff
  - autoheal.cluster.nodes
  - autoheal.cluster.slurm
  - autoheal.cluster.kube
"""

EXAMPLES = r"""
- name: Fence the failed nodes (Slurm drain + Kubernetes quarantine, concurrently)
  autoheal.cluster.fence:
    nodes: [gpu-3, gpu-4]
    incident_ids: [inc-42, inc-43]
    reasons: {gpu-3: "XID 79 gpu3 inc-42", gpu-4: "XID 79 gpu1 inc-43"}
    tier: replace
    slurm_conf: /etc/slurm/slurm.conf
    kubeconfig: /etc/autoheal/kubeconfig
  register: fence
"""

RETURN = r"""
slurm:
  description: The Slurm half, shaped like M(autoheal.cluster.slurm_node)'s result.
  returned: always
  type: dict
kube:
  description:
    - The Kubernetes half, shaped like M(autoheal.cluster.k8s_nodes)'s result ({} when O(kubernetes=false)).
  returned: always
  type: dict
slurm_nodes:
  description: The nodes Slurm knows.
  returned: always
  type: list
  elements: str
kube_nodes:
  description: The nodes Kubernetes knows (empty when O(kubernetes=false)).
  returned: always
  type: list
  elements: str
jobs:
  description:
    - The jobs of O(signal_jobs) - C(nodes) (those signalled - not opted out, labels read),
      C(opt_out) (node to why), C(unchecked) (labels unreadable), C(jobs) (records as
      M(autoheal.cluster.slurm_jobs) returns them), C(signalled_job_ids) (with O(signal_ledger), every
      job of the ledger), C(already_signalled) (found in O(signal_ledger), not signalled again),
      C(signalled_at) (epoch of the first signal, null when none), C(error) when signalling failed.
  returned: always
  type: dict
fenced_at:
  description: Epoch time both halves had finished - the nodes' C(fenced) time in the journal.
  returned: always
  type: float
gone_nodes:
  description: >-
    Nodes known neither to Slurm nor to Kubernetes (to Slurm only, when O(kubernetes=false)) -
    retired by an earlier run, or a name that was never a node.
  returned: always
  type: list
  elements: str
"""

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.autoheal.cluster.plugins.module_utils.contract import (
    INCIDENT_ANNOTATION,
    OPT_OUT_LABEL,
    QUARANTINE_TAINT_KEY,
    QUARANTINED,
    STATE_LABEL,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.kube import KUBE_COMMON_ARGS, Kube, KubeError
from ansible_collections.autoheal.cluster.plugins.module_utils.kube_nodes import (
    CORDON_OWNER_ANNOTATION,
    NodesError,
    apply,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm import (
    DEFAULT_PREFIX,
    SLURM_COMMON_ARGS,
    Slurm,
    SlurmError,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm_signal import (
    SignalLedger,
    find_jobs,
    signal,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.slurm_state import (
    StateError,
    Want,
    build_reasons,
    set_state,
)
from ansible_collections.autoheal.cluster.plugins.module_utils.validate import validate_nodes, validate_text

EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]


def argument_spec() -> dict[str, Any]:
    spec: dict[str, Any] = dict(
        nodes=dict(type="list", elements="str", required=True),
        reason=dict(type="str"),
        reasons=dict(type="dict", default={}),
        reason_prefix=dict(type="str", default=DEFAULT_PREFIX),
        incident_ids=dict(type="list", elements="str", default=[]),
        tier=dict(
            type="str",
            default="replace",
            choices=["notify", "restart_app", "reset", "reboot", "replace", "quarantine"],
        ),
        kubernetes=dict(type="bool", default=True),
        taint_key=dict(type="str", default=QUARANTINE_TAINT_KEY, no_log=False),
        taint_effect=dict(type="str", default="NoSchedule", choices=EFFECTS),
        state_label=dict(type="str", default=STATE_LABEL),
        incident_annotation=dict(type="str", default=INCIDENT_ANNOTATION),
        allow_missing=dict(type="bool", default=False),
        verify_seconds=dict(type="float", default=10),
        signal_jobs=dict(type="list", elements="str", default=[]),
        signal=dict(type="str", default="TERM", choices=["TERM", "INT", "USR1", "USR2"]),
        opt_out_label=dict(type="str", default=OPT_OUT_LABEL),
        signal_ledger=dict(type="path"),
    )
    spec.update(SLURM_COMMON_ARGS)
    spec.update(KUBE_COMMON_ARGS)
    return spec


def drain_want(module: Any, nodes: list[str]) -> Want:
    """The Slurm half's target: drained, each node with its reason (ours, prefixed)."""
    p = module.params
    for i in p["incident_ids"]:
        validate_text(module, i, "incident_ids")
    reason, per_node = build_reasons(module, p["reason_prefix"], p["reason"], p["reasons"])
    missing_reason = [n for n in nodes if per_node.get(n, reason) is None]
    if missing_reason:
        module.fail_json(msg="no reason for: " + ", ".join(missing_reason))
    return Want(
        "drain",
        reason,
        per_node,
        p["reason_prefix"],
        allow_missing=p["allow_missing"],
        verify_seconds=p["verify_seconds"],
    )


def quarantine(p: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """The Kubernetes half's target, as k8s_nodes options: cordon, taint, label, annotation."""
    ids = list(p["incident_ids"])
    return dict(
        cordon=True,
        cordon_owned_only=True,
        cordon_owner_annotation=CORDON_OWNER_ANNOTATION,
        labels={p["state_label"]: QUARANTINED},
        annotations={},
        node_annotations=(
            {n: {p["incident_annotation"]: i} for n, i in zip(nodes, ids)} if len(ids) == len(nodes) else {}
        ),
        taints=[dict(key=p["taint_key"], value=p["tier"], effect=p["taint_effect"], state="present")],
        allow_missing=p["allow_missing"],
    )


def opted_out(kube: Kube | None, nodes: list[str], label: str) -> tuple[dict[str, str], list[str]]:
    """({node: why} of the nodes opted out by their label or a live pod's, [nodes not readable]).
    A node Kubernetes does not know is not opted out (Slurm-only).

    Two lists by label selector, not a node read and a pod list per node: a 1,990-node storm sent
    3,980 reads beside its 1,990 cordons and slowed them. A list without a resourceVersion is a
    consistent read (the API server serves it from its watch cache once that has caught up)."""
    if kube is None or not nodes:
        return {}, []
    selector = {"labelSelector": f"{label}=true"}
    try:
        labelled = kube.request("GET", "/api/v1/nodes", query=selector).get("items") or []
        pods = kube.request("GET", "/api/v1/pods", query=selector).get("items") or []
    except KubeError:
        return {}, list(nodes)
    batch = set(nodes)
    why: dict[str, str] = {}
    for node in labelled:
        name = (node.get("metadata") or {}).get("name")
        if name in batch:
            why[name] = f"node label {label}=true"
    for pod in pods:
        meta = pod.get("metadata") or {}
        on = (pod.get("spec") or {}).get("nodeName")
        live = (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        if on in batch and on not in why and live:
            why[on] = f"pod {meta.get('namespace')}/{meta.get('name')}"
    return why, []


def signal_jobs(module: Any, slurm: Slurm, kube: Kube | None, nodes: list[str]) -> dict[str, Any]:
    """Signal the jobs on `nodes` that are not opted out (check mode: only list them); never
    raises, so the fence stands whatever happens here."""
    out: dict[str, Any] = dict(nodes=[], opt_out={}, unchecked=[], jobs=[], signalled_at=None)
    out.update(signalled_job_ids=[], already_signalled=[])
    if not nodes:
        return out
    try:
        out["opt_out"], out["unchecked"] = opted_out(kube, nodes, module.params["opt_out_label"])
        out["nodes"] = [n for n in nodes if n not in out["opt_out"] and n not in out["unchecked"]]
        if not out["nodes"]:
            return out
        if module.check_mode:
            out["jobs"] = find_jobs(slurm, set(out["nodes"]))
            return out
        # find and signal under the run's ledger lock: the warm fence and the play's fence step
        # never both signal a job, and a job signalled by the first and gone already is still
        # reported for its requeue
        with SignalLedger(module.params["signal_ledger"]) as ledger:
            out["jobs"] = find_jobs(slurm, set(out["nodes"]))
            earlier = dict(ledger.jobs)
            fresh = [j["job_id"] for j in out["jobs"] if j["job_id"] not in earlier]
            if fresh:
                signal(slurm, fresh, module.params["signal"], out)
                if out.pop("signal_stderr", None) is None:
                    ledger.add(fresh, out["signalled_at"], {j["job_id"]: j["nodes"] for j in out["jobs"]})
                else:
                    out["error"] = "scancel failed; slurm_jobs signals them"
            for j in out["jobs"]:
                j["signalled"] = j["job_id"] in ledger.jobs
            out["already_signalled"] = sorted(earlier)
            out["signalled_job_ids"] = sorted(ledger.jobs)
            if ledger.jobs:
                out["signalled_at"] = min(ledger.jobs.values())
    except Exception as exc:  # the fence must stand even if the signal could not be sent
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def run_halves(futures: dict[str, Future[dict[str, Any]]]) -> tuple[dict[str, Any], list[str]]:
    """Every half's result and the errors; a failing half never hides the other's result."""
    out: dict[str, Any] = dict(slurm={}, kube={})
    errors = []
    for half, fut in futures.items():
        try:
            out[half] = fut.result()
        except (StateError, NodesError) as exc:
            out[half] = exc.result
            errors.append(f"{half}: {exc.msg}")
        except SlurmError as exc:
            errors.append(f"{half}: {exc}")
        except Exception as exc:  # a bug in one half must not hide the other half's result
            errors.append(f"{half}: {type(exc).__name__}: {exc}")
    return out, errors


def where(nodes: list[str], out: dict[str, Any], kubernetes: bool) -> dict[str, list[str]]:
    """Which nodes each side knows, and those neither knows (the play skips those)."""
    slurm_missing = out["slurm"].get("missing_nodes", [])
    kube_missing = out["kube"].get("missing_nodes", []) if kubernetes else nodes
    return dict(
        slurm_nodes=[n for n in nodes if n not in slurm_missing],
        kube_nodes=[n for n in nodes if n not in kube_missing] if kubernetes else [],
        gone_nodes=[n for n in nodes if n in slurm_missing and n in kube_missing],
    )


def combined_diff(out: dict[str, Any]) -> dict[str, Any]:
    return {
        side: {half: out[half].get("diff", {}).get(side, {}) for half in ("slurm", "kube")}
        for side in ("before", "after")
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec=argument_spec(), supports_check_mode=True, required_one_of=[("reason", "reasons")]
    )
    p = module.params
    nodes = validate_nodes(module, p["nodes"])
    want = drain_want(module, nodes)
    slurm = Slurm(module)
    slurm.require("sinfo", "scontrol")
    slurm.raise_errors = True  # it runs in a thread: errors come back as exceptions
    kube = Kube(module) if p["kubernetes"] else None
    to_signal = validate_nodes(module, p["signal_jobs"], "signal_jobs") if p["signal_jobs"] else []
    sig_slurm = Slurm(module)
    sig_slurm.raise_errors = True
    if to_signal:
        sig_slurm.require("squeue", "scancel")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = dict(slurm=pool.submit(set_state, module, slurm, nodes, want))
        if kube is not None:
            futures["kube"] = pool.submit(apply, module, kube, nodes, quarantine(p, nodes))
        # concurrently with the drain: a job that checkpoints and exits is requeued only by
        # slurm_jobs, after the drain, so it never lands on the node again
        signalled = pool.submit(signal_jobs, module, sig_slurm, kube, to_signal)
        out, errors = run_halves(futures)
        out["fenced_at"] = time.time()  # the stamp is the fence's, not the next step's
        out["jobs"] = signalled.result()
    out.update(where(nodes, out, p["kubernetes"]))
    out["changed"] = any(out[half].get("changed") for half in ("slurm", "kube"))
    if module._diff and out["changed"]:
        out["diff"] = combined_diff(out)
    if errors:
        module.fail_json(msg="; ".join(errors), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
