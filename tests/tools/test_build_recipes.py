"""The Go build recipes work from an empty module cache (a fresh machine), without a full build.

A fresh machine once failed at the Kubernetes provider because a recipe read a module's folder
before anything had downloaded it; every machine the project was developed on already had it. Here
each recipe's prepare() (every step that reads module files) runs against an EMPTY `GOMODCACHE`.
Modules come through a file:// proxy over the machine's own module cache first (fast, no
network), then the real proxy, so only an explicit download fills the empty cache. The compile
itself is left out: `go build` always downloads what it compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-tools.sh"
RECIPES = REPO / "tools" / "gobuild"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs the Go toolchain")


def _go_env(name: str) -> str:
    return subprocess.run(["go", "env", name], capture_output=True, text=True, check=True).stdout.strip()


def _cold_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    warm = Path(_go_env("GOMODCACHE")) / "cache" / "download"
    proxy = _go_env("GOPROXY")
    return dict(
        os.environ,
        GOMODCACHE=str(tmp_path / "empty-modcache"),
        GOPROXY=f"file://{warm},{proxy}" if warm.is_dir() else proxy,
        GOSUMDB="off",  # the wrappers' go.sum still verifies every module
        AUTOHEAL_CACHE=str(tmp_path / "cache"),
        **extra,
    )


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _cleanup(path: Path) -> None:
    # Go makes the module cache read-only; pytest's tmp cleanup would trip over it.
    subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)


def test_every_recipe_folder_is_built_in_order() -> None:
    listed = _run(["--plan"], dict(os.environ))
    assert listed.returncode == 0, listed.stderr
    planned = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    folders = sorted(p.name for p in RECIPES.iterdir() if (p / "go.mod").exists())
    assert sorted(planned) == folders, "every tools/gobuild/<tool> needs a recipe.sh and a place in TOOLS"
    for line in listed.stdout.splitlines():
        _tool, version, state, cold = line.split("\t")
        assert version and state in {"cached", "build"} and int(cold) > 0, line


def test_build_steps_never_read_module_folders() -> None:
    """Reading a module's files belongs in prepare(), which downloads first (moddir)."""
    for recipe in RECIPES.glob("*/recipe.sh"):
        text = recipe.read_text()
        build = text[text.index("build() {") :]
        assert "go list -m" not in text, f"{recipe}: use moddir (it downloads) instead of go list -m"
        assert "moddir" not in build, f"{recipe}: module reads go in prepare(), not build()"


def test_prepare_steps_work_from_an_empty_module_cache(tmp_path: Path) -> None:
    try:
        res = _run(["--prepare-only", str(tmp_path / "out")], _cold_env(tmp_path))
        assert res.returncode == 0, res.stderr[-3000:]
        assert (tmp_path / "out" / "pulumi" / "pulumi-language-python-exec").stat().st_size > 0
        assert (tmp_path / "out" / "pulumi-kubernetes" / ".src" / "schema-embed.json").stat().st_size > 1e6
    finally:
        _cleanup(tmp_path)


def test_a_recipe_that_reads_before_downloading_fails_here(tmp_path: Path) -> None:
    """The check above can fail: the old provider recipe (`go list -m` first) breaks under it."""
    recipes = tmp_path / "recipes"
    bad = recipes / "pulumi-kubernetes"
    shutil.copytree(RECIPES / "pulumi-kubernetes", bad)
    text = (bad / "recipe.sh").read_text()
    (bad / "recipe.sh").write_text(
        text.replace(
            "mod=$(moddir github.com/pulumi/pulumi-kubernetes/provider/v4)",
            "mod=$(go list -m -f '{{.Dir}}' github.com/pulumi/pulumi-kubernetes/provider/v4)",
        )
    )
    try:
        env = _cold_env(tmp_path, AUTOHEAL_RECIPES=str(recipes))
        res = _run(["--prepare-only", str(tmp_path / "out"), "--only", "pulumi-kubernetes"], env)
        assert res.returncode != 0
        assert "schema.json" in res.stderr + res.stdout
    finally:
        _cleanup(tmp_path)
