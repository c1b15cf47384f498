"""One review from start to verdict: which stacks the change touches, every check, the findings.

Checks, by the name `--allow-skip` takes: `preview:<stack>` for each stack touched (`preview`
for all of them), `schedule:<stack>` (the stack's pods proven to bind, lab.schedulable), `lint`,
`monitoring`, `dryrun`. Each ends passed, failed, not run (a failure
of the review) or skipped (not run, allowed by the reviewer).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from review import changes, dryrun, tools
from review.engine import Engine
from review.model import CannotRun, CheckResult, Review, StackPreview, Status
from review.report import plan_summary
from review.stacks import Sides, Target, preview_stack

CHECKS = ("preview", "schedule", "lint", "monitoring", "dryrun")


@dataclass(frozen=True)
class Options:
    repo: Path
    env: Mapping[str, str]
    lab_kubeconfig: Path
    lab_slurm_conf: Path
    venv: Path
    base_ref: str | None = None
    stacks: Sequence[str] = ()  # empty: every stack the change touches
    allow_skip: frozenset[str] = frozenset()
    approvals: frozenset[str] = frozenset()
    deploy_base: bool = True
    dry_run_node: str = dryrun.DEFAULT_NODE
    only: Sequence[str] = CHECKS  # which checks to run at all (tests run fewer)


class UsageError(ValueError):
    """A bad option: names what is wrong (exit 2, nothing checked)."""


def allowed(name: str, allow: Collection[str]) -> bool:
    return name in allow or name.split(":", 1)[0] in allow


def check(name: str, title: str, allow: Collection[str], fn: Callable[[], tuple[bool, str]]) -> CheckResult:
    """Run one check: CannotRun is `not run` (or `skipped` when allowed), an error is a failure."""
    try:
        ok, detail = fn()
    except CannotRun as exc:
        return CheckResult(name, title, Status.SKIPPED if allowed(name, allow) else Status.NOT_RUN, str(exc))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        return CheckResult(name, title, Status.FAILED, f"{type(exc).__name__}: {exc}")
    return CheckResult(name, title, Status.PASSED if ok else Status.FAILED, detail)


@dataclass
class _Run:
    opts: Options
    sides: Sides
    approvals: set[str]
    work: Path
    review: Review

    def preview(self, stack: str, why: list[str]) -> tuple[bool, str]:
        target = Target(
            Engine(self.opts.env, self.opts.venv), self.opts.lab_kubeconfig, self.opts.deploy_base
        )
        holder = StackPreview(stack, why)
        self.review.previews.append(holder)
        try:
            result = preview_stack(stack, why, self.sides, target, self.approvals, self.work)
        except CannotRun as exc:
            holder.not_run = str(exc)
            raise
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            holder.errors.append(f"{type(exc).__name__}: {exc}")
            raise
        self.review.previews[self.review.previews.index(holder)] = result
        mandatory = [v for v in result.violations if v.level == "mandatory"]
        detail = [plan_summary(result.plan)]
        detail += [f"{len(result.violations)} policy violations"] if result.violations else []
        pending = [f for f in result.flags if not f.approved]
        detail += [f"{len(pending)} stateful changes need approval"] if pending else []
        detail += [f"error: {result.errors[0][:200]}"] if result.errors else []
        return not (mandatory or result.errors), "; ".join(detail)

    def schedule(self, stack: str) -> tuple[bool, str]:
        return tools.schedulable(self.sides.head, stack, self.opts.env)

    def lint(self) -> tuple[bool, str]:
        ok, self.review.lint = tools.ansible_lint(self.sides.head, self.opts.env)
        return ok, f"{len(self.review.lint)} findings"

    def monitoring(self) -> tuple[bool, str]:
        failures = tools.monitoring(self.sides.head, self.opts.env)
        return not failures, "; ".join(
            failures
        ) or "rules, rule tests, Prometheus and Alertmanager config are valid"

    def dryrun(self) -> tuple[bool, str]:
        o = self.opts
        ok, plan = dryrun.check_mode_run(
            self.sides.head, o.dry_run_node, o.lab_kubeconfig, o.lab_slurm_conf, o.env, self.work
        )
        self.review.dryrun = plan
        promoted = ", ".join(f"{spare} for {node}" for node, spare in plan.promotions) or "no spare"
        detail = (
            f"XID 79 on {o.dry_run_node}: drains {', '.join(plan.drained) or 'nothing'}, promotes {promoted}"
        )
        return ok, detail + (f"; failed at {plan.failed_task}" if plan.failed_task else "")


def _stacks(opts: Options, head: Path, files: Sequence[str]) -> dict[str, list[str]]:
    if not opts.stacks:
        return changes.touched_stacks(head, files)
    known = changes.stacks_in(head)
    unknown = [s for s in opts.stacks if s not in known]
    if unknown:
        raise UsageError(f"no Pulumi.<stack>.yaml for {unknown} (stacks: {', '.join(known)})")
    return {s: ["--stack"] for s in opts.stacks}


def _check_names(opts: Options, stacks: Collection[str]) -> None:
    valid = set(CHECKS) | {f"{c}:{s}" for c in ("preview", "schedule") for s in changes.stacks_in(opts.repo)}
    bad = sorted(set(opts.allow_skip) - valid)
    if bad:
        raise UsageError(f"--allow-skip {', '.join(bad)}: not a check (checks: {', '.join(sorted(valid))})")


def run_review(opts: Options, work: Path) -> Review:
    """The whole review; `work` is a scratch folder (copies of both revisions, logs)."""
    change = changes.describe_change(opts.repo, opts.base_ref or changes.default_base(opts.repo))
    head = changes.working_tree(opts.repo, work / "head")
    base = changes.checkout(opts.repo, change.merge_base, work / "base")
    stacks = _stacks(opts, head, change.files)
    _check_names(opts, stacks)
    sides = Sides(base, head, change.short_base)
    review = Review(base=change.short_base, base_ref=change.base_ref)
    run = _Run(opts, sides, set(change.approvals | opts.approvals), work, review)
    if not stacks:
        run.review.notes.append("The change touches no stack's inputs: there is nothing to preview.")
    if run.approvals:
        run.review.notes.append("Approval markers: " + ", ".join(f"`{a}`" for a in sorted(run.approvals)))
    allow = opts.allow_skip
    plan: list[tuple[str, str, Callable[[], tuple[bool, str]]]] = []
    if "preview" in opts.only:
        for stack, why in stacks.items():
            plan.append(
                (
                    f"preview:{stack}",
                    f"preview of `{stack}` with the policy pack",
                    partial(run.preview, stack, why),
                )
            )
    if "schedule" in opts.only:
        for stack in stacks:
            title = f"`{stack}`'s pods bind on nodes shaped like its own (KWOK, real scheduler)"
            plan.append((f"schedule:{stack}", title, partial(run.schedule, stack)))
    plan += [
        ("lint", "ansible-lint of playbooks/ and roles/", run.lint),
        ("monitoring", "promtool / amtool on monitoring/", run.monitoring),
        ("dryrun", "the XID runbook in check mode against the lab", run.dryrun),
    ]
    for name, title, fn in plan:
        if name.split(":", 1)[0] in opts.only:
            run.review.checks.append(check(name, title, allow, fn))
    return run.review
