"""`autoheal preflight`: check an existing cluster against a stack before `pulumi up` installs on it
(registered into the root CLI through the `autoheal.cli` entry-point group; the checks live in
components/preflight/, which the Pulumi program runs too)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoheal.cli import JsonOpt

console = Console(stderr=True)
out = Console()

_STYLE = {"pass": "green", "info": "cyan", "warn": "yellow", "fail": "red"}


def preflight(
    stack: Annotated[str, typer.Option("--stack", help="The stack whose Pulumi.<stack>.yaml is read.")],
    project: Annotated[
        Path, typer.Option("--project", help="The folder of Pulumi.yaml and the stack files.")
    ] = Path("."),
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", help="Check this kubeconfig's cluster instead of the stack's."),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="The kubeconfig context to use.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for a connection to the API server.")] = 5.0,
    json_: JsonOpt = False,
) -> None:
    from components.preflight import load_stack
    from components.preflight import preflight as run

    cfg = load_stack(project, stack)
    if cfg.cluster.backend != "kubeconfig" and kubeconfig is None:
        console.print(
            f"stack {stack}: backend {cfg.cluster.backend} builds its own cluster; nothing to check "
            "(pass --kubeconfig to check a cluster against the stack anyway)"
        )
        raise typer.Exit(0)
    report = run(cfg, project.resolve(), stack, kubeconfig, context, connect_timeout=timeout)
    if json_:
        out.print_json(json.dumps(report.as_dict()))
    else:
        table = Table(title=f"preflight of stack {stack} against {report.server}")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for c in report.checks:
            style = _STYLE[c.status]
            table.add_row(c.name, f"[{style}]{c.status}[/{style}]", c.detail, c.fix)
        out.print(table)
        verdict = "[red]FAILED[/red]" if not report.ok else "[green]ok[/green]"
        console.print(
            f"preflight {verdict}: {len(report.failed)} of {len(report.checks)} checks failed "
            f"({report.seconds:.1f} s)"
        )
        if not cfg.preflight:
            console.print(
                f"note: stack {stack} sets preflight: false, so `pulumi up` does not run these checks"
            )
    raise typer.Exit(0 if report.ok else 1)


HELP = (
    "Check that the cluster of a cluster.backend: kubeconfig stack has what the stack needs, before"
    " `pulumi up` installs on it (`pulumi up` and `pulumi preview` run the same checks).\n\n"
    "Each check says pass, info, warn or fail, and how to fix it: the pools' nodes (labelled"
    " autoheal.io/pool=<name>, size + spares of them, carrying the pool's labels, advertising"
    " nvidia.com/gpu), the StorageClasses the stack's volumes use, the Prometheus Operator's CRDs and"
    " selectors (monitoring.prometheusOperator), a node the system pods can run on, the Kubernetes"
    " version of the server and the kubelets (1.29 or later), what the nodes run. An unreachable"
    " cluster fails within --timeout seconds.\n\n"
    "Exit status: 0 when no check fails (warnings allowed), 1 when one does, 2 when the stack's config"
    " cannot be read."
)


def register(app: typer.Typer) -> None:
    app.command("preflight", help=HELP)(preflight)
