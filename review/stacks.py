"""Preview one stack the change touches, the way its cluster allows.

* The `lab` stack: the real engine against the lab's real control plane. The merge base is
  deployed into the lab first (the lab is scratch; its own state backend), then the change is
  previewed against it with the policy pack, so the diff is what the change would do to a
  cluster running the merge base.
* A stack on a cloud backend (EKS): the cloud cannot be reached here, so both revisions' programs
  run under Pulumi mocks (cloud APIs simulated, everything else real) and what they declare is
  compared (review.plan.diff_declared); the policy rules judge the change's resources.
* Any other kubeconfig stack: the real engine against its own cluster and state, previewed only
  (a review never writes to a real cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policy.rules import judge
from review import engine as eng
from review.mockstack import Recorded, load
from review.model import CannotRun, StackPreview, Violation
from review.plan import REPLACE, Step, diff_declared, plan_from_events, read_event_log, resources_from_events
from review.stateful import stateful_flags

LAB_STACK = "lab"
MOCKSTACK = Path(__file__).with_name("mockstack.py")


@dataclass(frozen=True)
class Sides:
    """The two revisions of the project, each in a folder of its own."""

    base: Path
    head: Path
    base_name: str  # e.g. the merge base's short hash


@dataclass(frozen=True)
class Target:
    engine: eng.Engine
    lab_kubeconfig: Path
    deploy_base: bool = True


def backend_of(project: Path, stack: str) -> str:
    doc = yaml.safe_load((project / f"Pulumi.{stack}.yaml").read_text()) or {}
    cluster = (doc.get("config") or {}).get("autoheal:cluster") or {}
    return str(cluster.get("backend", "kubeconfig")) if isinstance(cluster, dict) else "kubeconfig"


def preview_stack(
    stack: str, why: list[str], sides: Sides, target: Target, approvals: set[str], work: Path
) -> StackPreview:
    """Raises CannotRun when the preview cannot happen (no engine, no cluster)."""
    result = StackPreview(stack, why)
    if backend_of(sides.head, stack) != "kubeconfig":
        _with_mocks(result, sides, work)
    else:
        _with_engine(result, sides, target, work)
    result.flags = stateful_flags(result.plan, approvals)
    return result


# --- mocks ---------------------------------------------------------------------------------


def _declared(project: Path, stack: str, out: Path) -> Recorded:
    res = subprocess.run(
        [sys.executable, str(MOCKSTACK), str(project), stack, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if res.returncode != 0:
        raise RuntimeError(
            res.stderr.strip().splitlines()[-1] if res.stderr.strip() else f"exit {res.returncode}"
        )
    text = out.read_text().replace(str(project), "<project>")  # paths resolved inside each copy
    return load(json.loads(text))


def _with_mocks(result: StackPreview, sides: Sides, work: Path) -> None:
    stack = result.stack
    result.how = "Pulumi mocks (cloud APIs simulated): the two revisions' programs compared"
    try:
        head = _declared(sides.head, stack, work / f"{stack}-head.json")
    except RuntimeError as exc:
        result.errors.append(f"the change's program fails: {exc}")
        return
    base = Recorded()
    if (sides.base / f"Pulumi.{stack}.yaml").exists():
        try:
            base = _declared(sides.base, stack, work / f"{stack}-base.json")
            result.baseline = f"the stack as the merge base {sides.base_name} declares it"
        except RuntimeError as exc:
            result.baseline = f"none: the merge base's program fails ({exc})"
    else:
        result.baseline = "none: the stack is new in this change"
    result.plan = diff_declared(base, head)
    rows = [(r.urn, r.type, r.inputs) for r in head.resources if r.custom]
    result.violations = [Violation(rule, urn, msg) for rule, urn, msg in judge(rows)]


# --- the real engine ------------------------------------------------------------------------


def _with_engine(result: StackPreview, sides: Sides, target: Target, work: Path) -> None:
    stack = result.stack
    kubeconfig = target.lab_kubeconfig if stack == LAB_STACK else _own_kubeconfig(sides.head, stack)
    why_not = eng.kube_unreachable(kubeconfig)
    if why_not is not None:
        where = "the lab's Kubernetes API" if stack == LAB_STACK else f"the Kubernetes API of stack {stack}"
        hint = " (start it: autoheal lab up)" if stack == LAB_STACK else ""
        raise CannotRun(f"{where} is not reachable at {kubeconfig}: {why_not}{hint}")
    target.engine.binary()  # CannotRun when the CLI is missing
    override = kubeconfig if stack == LAB_STACK else None
    result.how = f"real Pulumi engine, policy pack, against {kubeconfig}"
    result.baseline = _baseline(stack, sides, target, override, work)
    config = eng.write_stack_config(sides.head, stack, work / f"{stack}-head.yaml", override)
    _engine_preview(result, target.engine, sides.head, config, work)


def _engine_preview(
    result: StackPreview, engine: eng.Engine, project: Path, config: Path, work: Path
) -> None:
    """Preview with the pack. pulumi-kubernetes cannot dry-run the new object of a replacement
    while the old one (same name) exists, which aborts the preview there; such resources are
    kept as the replacements the engine planned, and the rest is previewed again without them
    (`--exclude`), so the diff stays complete. Their new inputs are judged by the policy rules."""
    stack = result.stack
    blocked: dict[str, Step] = {}
    for attempt in range(4):
        log = work / f"{stack}-events-{attempt}.json"
        res = eng.preview(engine, project, stack, config, project / "policy", log, exclude=list(blocked))
        events = read_event_log(log)
        plan = plan_from_events(events)
        errors = eng.errors_from_events(events)
        newly = {s.urn: s for s in plan.of(REPLACE) if s.urn not in blocked and _names(errors, s.urn)}
        if res.returncode == 0 or not newly:
            break
        blocked.update(newly)
    if eng.NO_RUN_PLUGIN in res.stdout + res.stderr:
        events = _without_pack(result, engine, project, stack, config, work, list(blocked))
        plan = plan_from_events(events)
    else:
        result.violations = eng.violations_from_events(events)
        if not eng.pack_loaded(events):
            result.errors.append("the policy pack did not run (the engine reported no policy events)")
    rows = [(s.urn, s.type, s.new) for s in blocked.values()]
    result.violations += [Violation(rule, urn, msg) for rule, urn, msg in judge(rows)]
    plan.steps += list(blocked.values())
    result.plan = plan
    result.notes += [f"`{s.name}`: the provider cannot dry-run its replacement while the old object exists; "
                     "the rest of the stack was previewed without it" for s in blocked.values()]  # fmt: skip
    if res.returncode != 0 and not result.violations:
        result.errors += [e for e in errors if not any(_names([e], u) for u in blocked)] or [
            (res.stdout + res.stderr).strip()[-2000:]
        ]


def _names(errors: list[str], urn: str) -> bool:
    return any(urn in e and "was not successfully created" in e for e in errors)


def _own_kubeconfig(project: Path, stack: str) -> Path:
    doc = yaml.safe_load((project / f"Pulumi.{stack}.yaml").read_text()) or {}
    path = Path(str(((doc.get("config") or {}).get("autoheal:cluster") or {}).get("kubeconfig", "")))
    return path if path.is_absolute() else (project / path)


def _baseline(stack: str, sides: Sides, target: Target, kubeconfig: Path | None, work: Path) -> str:
    if stack != LAB_STACK or not target.deploy_base:
        return "the stack's deployed state"
    if not (sides.base / f"Pulumi.{stack}.yaml").exists():
        return "the lab's current state (the stack is new in this change)"
    config = eng.write_stack_config(sides.base, stack, work / f"{stack}-base.yaml", kubeconfig)
    eng.deploy(target.engine, sides.base, stack, config)
    return f"the merge base {sides.base_name}, deployed into the lab first"


def _without_pack(
    result: StackPreview,
    engine: eng.Engine,
    project: Path,
    stack: str,
    config: Path,
    work: Path,
    exclude: list[str],
) -> list[dict[str, Any]]:
    """A language host that cannot start policy packs: preview without the pack, and judge the
    previewed resources with the pack's rules (policy.rules.judge)."""
    log = work / f"{stack}-events-nopack.json"
    eng.preview(engine, project, stack, config, None, log, exclude=exclude)
    events = read_event_log(log)
    result.violations = [Violation(rule, urn, msg) for rule, urn, msg in judge(resources_from_events(events))]
    result.how += " (policy rules applied to the preview: this language host cannot run packs)"
    return events
