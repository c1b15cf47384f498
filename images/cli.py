"""`autoheal images ...`: build the container images (and push them to a registry)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoheal.cli import JsonOpt
from autoheal.imagelock import LOCK_FILE, write_lock
from autoheal.paths import data_root
from images.recipes import RECIPES

if TYPE_CHECKING:  # the builder is imported by the build command, not by every `autoheal` command
    from images.build import BuiltImage

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


def default_lock() -> Path:
    """`images.lock.json` in the Pulumi project folder, where the stack's `__main__.py` reads it."""
    return data_root() / LOCK_FILE


def record_lock(path: Path, imgs: Sequence[BuiltImage], pushed: Mapping[str, str]) -> dict[str, str]:
    """Write what this build produced to the lock file the stack takes its default images from:
    the pushed reference where an image was pushed (what the cluster can pull), else the local
    one, both by digest. Returns the lock's images (earlier entries of images not built kept)."""
    return write_lock(path, {i.name: pushed.get(i.name, i.ref) for i in imgs})


@images_app.command("build")
def images_build(
    image: Annotated[
        list[str] | None,
        typer.Option("--image", help=f"Build only these ({', '.join(RECIPES)}); repeatable."),
    ] = None,
    push: Annotated[
        str | None,
        typer.Option(
            "--push",
            # escaped: Typer renders help as Rich markup, where "[/path]" would be a closing tag
            help=escape("Then push them to this registry (host[:port][/path]), digests unchanged."),
        ),
    ] = None,
    tls_verify: Annotated[bool, typer.Option(help="Verify the registry's TLS certificate.")] = True,
    rebuild: Annotated[bool, typer.Option(help="Ignore the cache and build again.")] = False,
    lock: Annotated[
        Path | None,
        typer.Option(
            "--lock",
            help=f"Record the references by digest (the pushed ones with --push) in this file; "
            f"default: {LOCK_FILE} in the Pulumi project folder, where the stack takes its "
            "default images from.",
            dir_okay=False,
        ),
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Build the images (cached: only a changed input rebuilds), optionally push them, and record
    their references by digest in the lock file the stack defaults to."""
    lock_path = lock or default_lock()  # before a build of minutes: no data root fails now
    from images.build import build

    imgs = build(image, lambda m: console.print(f"[dim]images[/dim] {m}"), rebuild=rebuild)
    pushed: dict[str, str] = {}
    if push:
        from images.push import push as push_one

        for i in imgs:
            pushed[i.name] = push_one(i, push, tls_verify)
            console.print(f"[dim]images[/dim] pushed {pushed[i.name]}")
    locked = record_lock(lock_path, imgs, pushed)
    console.print(f"[dim]images[/dim] recorded in {lock_path}: {', '.join(sorted(locked))}")
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
