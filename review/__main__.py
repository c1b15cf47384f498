"""`python -m review`: review the change in this checkout; Markdown on stdout (and --markdown).

Exit status: 0 the review passed, 1 it failed (a check failed or did not run, a policy
violation, an unapproved stateful replacement), 2 a usage or git error (nothing was checked).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from review.changes import GitError
from review.report import render
from review.run import CHECKS, Options, UsageError, run_review


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m review", description=__doc__.splitlines()[0])
    p.add_argument(
        "--stack",
        action="append",
        default=[],
        help="preview this stack (repeatable); "
        "default: every stack whose Pulumi.<stack>.yaml or inputs the change touches",
    )
    p.add_argument("--base", help="the branch the change merges into (default: origin/main, else main)")
    p.add_argument(
        "--allow-skip",
        action="append",
        default=[],
        metavar="CHECK",
        help=f"accept that CHECK does not run ({', '.join(CHECKS)}, preview:<stack>, schedule:<stack>)",
    )
    p.add_argument(
        "--approve",
        action="append",
        default=[],
        metavar="NAME",
        help="approve replacing or deleting this stateful resource (logical name, or all)",
    )
    p.add_argument(
        "--lab-dir",
        type=Path,
        default=Path(".lab/default"),
        help="the lab: its kubeconfig and slurm/slurm.conf (default .lab/default)",
    )
    p.add_argument(
        "--no-deploy-base",
        action="store_true",
        help="preview the lab stack against the lab's current state, not the merge base",
    )
    p.add_argument(
        "--dry-run-node", default="gpu-1", help="the node the check-mode run fails (default gpu-1)"
    )
    p.add_argument("--markdown", type=Path, help="also write the Markdown summary here")
    p.add_argument("--only", action="append", choices=CHECKS, help="run only these checks")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    repo = Path.cwd()
    lab = args.lab_dir.resolve()
    opts = Options(
        repo=repo,
        env=dict(os.environ),
        lab_kubeconfig=lab / "kubeconfig",
        lab_slurm_conf=lab / "slurm" / "slurm.conf",
        venv=Path(sys.prefix),
        base_ref=args.base,
        stacks=args.stack,
        allow_skip=frozenset(args.allow_skip),
        approvals=frozenset(a for item in args.approve for a in item.split()),
        deploy_base=not args.no_deploy_base,
        dry_run_node=args.dry_run_node,
        only=args.only or CHECKS,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="autoheal-review-") as work:
            review = run_review(opts, Path(work))
    except (GitError, UsageError) as exc:
        print(f"review: {exc}", file=sys.stderr)
        return 2
    text = render(review)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0 if review.passed else 1


if __name__ == "__main__":
    sys.exit(main())
