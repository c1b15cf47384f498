"""The root `autoheal` command: the core's own commands plus those the upper layers register.

The core knows nothing of the runner or the lab. Each registers its command groups through the
`autoheal.cli` entry-point group (see pyproject.toml), so the import graph stays one-way:
core <- runner / components <- lab <- CLI wiring.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoheal.errors import AutohealError

app = typer.Typer(
    help="autoheal: self-healing GPU training clusters (Slurm on Kubernetes).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
out = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def _version(value: bool) -> None:
    if value:
        # the code's own version, not the installed metadata's (an editable install keeps the
        # version it was installed with)
        from autoheal import __version__

        print(f"autoheal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """autoheal: self-healing GPU training clusters (Slurm on Kubernetes)."""


PLUGIN_GROUP = "autoheal.cli"


def register_plugins(root: typer.Typer) -> list[str]:
    """Let the layers above the core add their commands (the runner, the lab).

    They declare a ``register(app)`` function in the ``autoheal.cli`` entry-point group, so the
    core never imports them and a wheel without the lab still has a working CLI.
    """
    loaded: list[str] = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            console.print(f"[yellow]warning:[/yellow] `autoheal {ep.name}` unavailable: {exc}")
            continue
        register(root)
        loaded.append(ep.name)
    return loaded


def main() -> None:
    register_plugins(app)
    try:
        app()
    except AutohealError as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # one line: scripts read it
        sys.exit(2)


monitoring_app = typer.Typer(
    help="Prometheus rules and Alertmanager routes from the XID catalogue.", no_args_is_help=True
)
app.add_typer(monitoring_app, name="monitoring")


@monitoring_app.command("render")
def monitoring_render(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write.")] = Path("monitoring"),
) -> None:
    """Write the shipped rule, Prometheus and Alertmanager files."""
    from autoheal.monitoring import render_shipped

    for f in render_shipped(str(out_dir)):
        console.print(f"wrote {f}")


@app.command("xids")
def xids(json_: JsonOpt = False) -> None:
    """List the XID catalogue: XID, NVIDIA's resolution bucket, the ladder's rung, name."""
    from autoheal.xid import load_catalog

    cat = load_catalog()
    if json_:
        out.print_json(cat.model_dump_json())
        return
    t = Table(title=f"XID catalogue v{cat.version} ({cat.source})")
    for col in ("xid", "bucket", "tier", "name"):
        t.add_column(col)
    for e in cat.xids:
        t.add_row(str(e.xid), e.bucket.value, e.tier.value, e.name)
    out.print(t)
