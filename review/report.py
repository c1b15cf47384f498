"""The review as Markdown, ready to paste as a pull-request comment (the workflow posts it as its
job summary): verdict, checks, stateful changes needing approval, each stack's preview diff,
policy violations, lint findings and the runbook's check-mode plan."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from review.model import DryRunPlan, Review, StackPreview, Status
from review.plan import CREATE, DELETE, REPLACE, UPDATE, Plan

OP_WORDS = {CREATE: "create", UPDATE: "update", REPLACE: "**REPLACE**", DELETE: "**DELETE**"}
OP_ORDER = (REPLACE, DELETE, UPDATE, CREATE)
STATUS_WORDS = {
    Status.PASSED: "passed",
    Status.FAILED: "**FAILED**",
    Status.NOT_RUN: "**NOT RUN**",
    Status.SKIPPED: "skipped (allowed)",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


def plan_summary(plan: Plan) -> str:
    parts = [f"{plan.count(op)} to {op}" for op in (CREATE, UPDATE, REPLACE, DELETE) if plan.count(op)]
    return ", ".join([*parts, f"{plan.unchanged} unchanged"])


def render(review: Review) -> str:
    lines = [f"## autoheal review: {'passed' if review.passed else 'FAILED'}", ""]
    stacks = ", ".join(f"`{p.stack}`" for p in review.previews) or "none"
    lines += [
        f"Change against the merge base `{review.base}` of `{review.base_ref}`. Stacks touched: {stacks}."
    ]
    lines += [f"- {note}" for note in review.notes]
    lines += ["", *_table(("check", "result", "detail"), _check_rows(review)), ""]
    lines += _not_run(review)
    lines += _stateful(review)
    for preview in review.previews:
        lines += _preview(preview)
    lines += _violations(review.previews)
    lines += _lint(review)
    lines += _dryrun(review.dryrun)
    return "\n".join(lines).rstrip() + "\n"


def _check_rows(review: Review) -> list[list[str]]:
    return [[f"`{c.name}` {c.title}", STATUS_WORDS[c.status], c.detail] for c in review.checks]


def _not_run(review: Review) -> list[str]:
    missing = [c.name for c in review.checks if c.status == Status.NOT_RUN]
    if not missing:
        return []
    names = ", ".join(f"`{m}`" for m in missing)
    return [
        f"**Did not run: {names}.** A check that did not run fails the review: make it runnable, or "
        f"pass `--allow-skip NAME` (`make review ALLOW_SKIP=...`) to accept the gap on purpose.",
        "",
    ]


def _stateful(review: Review) -> list[str]:
    flags = [(p.stack, f) for p in review.previews for f in p.flags]
    if not flags:
        return []
    rows = [
        [stack, OP_WORDS[f.step.op], f"`{f.step.name}`", f.what, "yes" if f.approved else "**no**"]
        for stack, f in flags
    ]
    lines = ["### Stateful resources replaced or deleted", ""]
    lines += [*_table(("stack", "op", "resource", "what would be lost", "approved"), rows), ""]
    pending = sorted({f.step.name for _, f in review.unapproved()})
    if pending:
        lines += [
            "These need an explicit approval: add a trailer to a commit message of the change, one per "
            "resource (" + ", ".join(f"`Autoheal-Approve: {n}`" for n in pending) + "), or pass "
            "`--approve NAME` (`make review APPROVE=...`).",
            "",
        ]
    return lines


def _preview(preview: StackPreview) -> list[str]:
    if preview.not_run:
        return [f"### Preview of `{preview.stack}`: did not run", "", preview.not_run, ""]
    if preview.errors and not preview.how:
        return [
            f"### Preview of `{preview.stack}`: failed",
            "",
            *(f"**Error:** {_cell(e)}" for e in preview.errors),
            "",
        ]
    lines = [f"### Preview of `{preview.stack}`: {plan_summary(preview.plan)}", ""]
    lines += [f"How: {preview.how}. Baseline: {preview.baseline or 'n/a'}."]
    lines += [f"Touched by: {', '.join(f'`{f}`' for f in preview.why)}.", ""]
    lines += [f"**Error:** {_cell(e)}" for e in preview.errors]
    lines += [f"Note: {_cell(n)}" for n in preview.notes]
    lines += [""] if preview.errors or preview.notes else []
    steps = sorted(preview.plan.steps, key=lambda s: (OP_ORDER.index(s.op), s.name))
    rows = [[OP_WORDS[s.op], f"`{s.name}`", f"`{s.type}`", ", ".join(s.keys)] for s in steps if s.custom]
    if rows:
        lines += _table(("op", "resource", "type", "properties"), rows)
    return [*lines, ""]


def _violations(previews: Sequence[StackPreview]) -> list[str]:
    rows = [
        [p.stack, f"`{v.rule}`", f"`{v.resource.split('::')[-1]}`" if v.resource else "(stack)", v.message]
        for p in previews
        for v in p.violations
    ]
    if not rows:
        return ["### Policy violations", "", "None.", ""] if previews else []
    return ["### Policy violations", "", *_table(("stack", "rule", "resource", "message"), rows), ""]


def _lint(review: Review) -> list[str]:
    if not any(c.name == "lint" and c.status in (Status.PASSED, Status.FAILED) for c in review.checks):
        return []
    if not review.lint:
        return ["### Lint findings", "", "None.", ""]
    rows = [[f"`{f.rule}`", f"`{f.path}:{f.line}`", f.severity, f.message] for f in review.lint]
    return ["### Lint findings", "", *_table(("rule", "where", "severity", "message"), rows), ""]


def _dryrun(plan: DryRunPlan | None) -> list[str]:
    if plan is None:
        return []

    def names(items: Sequence[str]) -> str:
        return ", ".join(f"`{n}`" for n in items) or "none"

    promoted = ", ".join(f"`{spare}` for `{node}`" for node, spare in plan.promotions) or "none"
    lines = [
        f"### Runbook check-mode plan (XID 79 on {names(plan.nodes)})",
        "",
        f"- drained in Slurm (fence): {names(plan.drained)}",
        f"- quarantined in Kubernetes (cordon, taint, label): {names(plan.quarantined)}",
        f"- hot spares promoted: {promoted}",
        f"- no free spare for: {names(plan.no_spare)}",
        f"- emptied by the Kubernetes drain: {names(plan.evicted)}",
        f"- retired from the pool: {names(plan.retired)}",
    ]
    if plan.failed_task:
        lines.append(f"- **failed at** {plan.failed_task}")
    return [*lines, ""]
