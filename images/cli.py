"""`autoheal images ...`: build the container images (and push them to a registry)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoheal.cli import JsonOpt
from images.build import BuiltImage, build
from images.recipes import RECIPES

console = Console(stderr=True)
out = Console()

images_app = typer.Typer(
    help="Container images built from Debian packages (no registry needed): pause, slurm, runner.",
    no_args_is_help=True,
)


def _table(imgs: list[BuiltImage], pushed: dict[str, str]) -> Table:
    t = Table(title="images")
    for col in ("image", "reference (by digest)", "size", "build", "pushed"):
        t.add_column(col)
    for i in imgs:
        built = "cached" if i.cached else f"{i.build_seconds:.0f}s"
        t.add_row(i.name, i.ref, f"{i.size / 1e6:.0f} MB", built, pushed.get(i.name, ""))
    return t


@images_app.command("build")
def images_build(
    image: Annotated[
        list[str] | None,
        typer.Option("--image", help=f"Build only these ({', '.join(RECIPES)}); repeatable."),
    ] = None,
    push: Annotated[
        str | None,
        typer.Option(
            "--push", help="Then push them to this registry (host[:port][/path]), digests unchanged."
        ),
    ] = None,
    tls_verify: Annotated[bool, typer.Option(help="Verify the registry's TLS certificate.")] = True,
    rebuild: Annotated[bool, typer.Option(help="Ignore the cache and build again.")] = False,
    json_: JsonOpt = False,
) -> None:
    """Build the images (cached: only a changed input rebuilds), optionally push them."""
    imgs = build(image, lambda m: console.print(f"[dim]images[/dim] {m}"), rebuild=rebuild)
    pushed: dict[str, str] = {}
    if push:
        from images.push import push as push_one

        for i in imgs:
            pushed[i.name] = push_one(i, push, tls_verify)
            console.print(f"[dim]images[/dim] pushed {pushed[i.name]}")
    if json_:
        print(
            json.dumps(
                [{**i.as_dict(), **({"pushed": pushed[i.name]} if i.name in pushed else {})} for i in imgs]
            )
        )
    else:
        out.print(_table(imgs, pushed))


@images_app.command("list")
def images_list(json_: JsonOpt = False) -> None:
    """The recipes: what each image holds and the check that proves it works."""
    if json_:
        print(
            json.dumps(
                {
                    n: {"description": r.description, "packages": list(r.packages), "check": r.check}
                    for n, r in RECIPES.items()
                }
            )
        )
        return
    t = Table(title="image recipes")
    for col in ("image", "suite", "holds", "check"):
        t.add_column(col)
    for n, r in RECIPES.items():
        t.add_row(n, r.suite, r.description, r.check or "(runs as every pod's sandbox)")
    out.print(t)


def register(app: typer.Typer) -> None:
    """Add `autoheal images ...` to the root app (entry point group autoheal.cli)."""
    app.add_typer(images_app, name="images")
