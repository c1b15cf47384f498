"""The runbook's check-mode run against the lab: what an XID 79 on one node would do, changing
nothing (`ansible-playbook --check`), read from Ansible's JSON output.

The plan names the nodes the fence would drain in Slurm and quarantine in Kubernetes, the spare
each failed node would get, the nodes the Kubernetes drain would empty and those the pool would
retire. It needs the lab's Kubernetes API and slurmctld: without them the run proves nothing
beyond syntax (ansible-lint covers that), so it raises CannotRun.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from review.engine import kube_unreachable
from review.model import CannotRun, DryRunPlan

RUNBOOK = "playbooks/gpu_fatal_xid.yml"
DEFAULT_NODE = "gpu-1"  # the lab's first active node


def slurm_unreachable(slurm_conf: Path, env: Mapping[str, str]) -> str | None:
    if not slurm_conf.is_file():
        return f"no slurm.conf at {slurm_conf}"
    scontrol = shutil.which("scontrol", path=env.get("PATH", ""))
    if scontrol is None:
        return "scontrol is not installed (Debian: slurm-client)"
    res = subprocess.run(
        [scontrol, "ping"],
        env={**env, "SLURM_CONF": str(slurm_conf)},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    return None if res.returncode == 0 and "UP" in res.stdout else f"scontrol ping: {res.stdout.strip()}"


def check_mode_run(
    project: Path, node: str, kubeconfig: Path, slurm_conf: Path, env: Mapping[str, str], work: Path
) -> tuple[bool, DryRunPlan]:
    """(the run succeeded, what it would do)."""
    playbook = shutil.which("ansible-playbook", path=env.get("PATH", ""))
    if playbook is None:
        raise CannotRun("ansible-playbook is not installed (pip install -e .)")
    problems = [p for p in (kube_unreachable(kubeconfig), slurm_unreachable(slurm_conf, env)) if p]
    if problems:
        raise CannotRun(f"the lab is not reachable ({'; '.join(problems)}); start it: autoheal lab up")
    extra = {
        "autoheal_nodes": [node],
        "autoheal_incident_ids": ["review-dry-run"],
        "autoheal_xid": 79,
        "autoheal_gpu": 0,
        "autoheal_tier": "replace",
        "autoheal_backend": "none",
        "autoheal_kubeconfig": str(kubeconfig),
        "autoheal_slurm_conf": str(slurm_conf),
    }
    extra_file = work / "dryrun-vars.json"
    extra_file.write_text(json.dumps(extra))
    res = subprocess.run(
        [playbook, "--check", "--diff", RUNBOOK, "-e", f"@{extra_file}"],
        cwd=project,
        env={**env, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json", "SLURM_CONF": str(slurm_conf)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return res.returncode == 0, read_plan(json_report(res.stdout, res.stderr), [node])


def json_report(stdout: str, stderr: str) -> dict[str, Any]:
    """The JSON callback's report: one object, which other callbacks enabled in ansible.cfg (e.g.
    profile_tasks' timing lines) may print around."""
    start = 0 if stdout.startswith("{") else stdout.find("\n{") + 1
    try:
        report = (
            json.JSONDecoder().raw_decode(stdout, start)[0] if start > 0 or stdout.startswith("{") else None
        )
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or "plays" not in report:
        raise RuntimeError(f"ansible-playbook printed no JSON report: {(stdout + stderr).strip()[-500:]}")
    return report


def _results(report: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for play in report.get("plays", []):
        for task in play.get("tasks", []):
            for result in (task.get("hosts") or {}).values():
                yield str((task.get("task") or {}).get("name", "")), result


def read_plan(report: Mapping[str, Any], nodes: list[str]) -> DryRunPlan:
    """The plan from the JSON callback's report (ansible.posix.json)."""
    plan = DryRunPlan(nodes=nodes)
    for name, result in _results(report):
        action = str(result.get("action", ""))
        facts = result.get("ansible_facts") or {}
        if action.endswith(".fence"):
            plan.drained += (result.get("slurm") or {}).get("changed_nodes", [])
            plan.quarantined += (result.get("kube") or {}).get("changed_nodes", [])
        elif action.endswith(".slurm_spares"):
            plan.promotions += [
                (p["node"], p["spare"]) for p in result.get("promotions", []) if p.get("spare")
            ]
            plan.no_spare += list(result.get("shortfall", []))
        plan.evicted += facts.get("k8s_node_drained", [])
        plan.retired += facts.get("node_pool_retired", [])
        if result.get("failed") and not result.get("ignore_errors") and not plan.failed_task:
            plan.failed_task = f"{name}: {str(result.get('msg', ''))[:300]}"
    return plan
