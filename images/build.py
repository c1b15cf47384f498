"""Build the images, content-addressed and cached: nothing is rebuilt unless an input changed.

An image's cache key hashes its recipe (suite, packages, hooks, runtime config) and, for the
runner, the pinned Python requirements and the project's files. A finished build is an OCI layout
under ``<cache>/images/<name>-<key>/`` with ``build.json`` written last, so a build cut short is
simply built again. The runner is two layers with keys of their own: the Debian base with its
Python dependencies (minutes to build), and the project on top (seconds), so editing the project
does not rebuild the base.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from autoheal import __version__
from images import debian, oci, python
from images.debian import BuildError
from images.fake_gpu import TEST_RECIPES
from images.recipes import PYTHON, RECIPE_REV, RECIPES, Recipe

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def cache_root() -> Path:
    """${AUTOHEAL_CACHE:-~/.cache/autoheal}/images (the Go tools' cache sits beside it)."""
    base = os.environ.get("AUTOHEAL_CACHE") or str(Path.home() / ".cache" / "autoheal")
    return Path(base) / "images"


@dataclass(frozen=True)
class BuiltImage:
    name: str
    key: str
    repository: str
    tag: str
    digest: str  # the manifest's: the image's identity
    layout: str  # the OCI layout directory
    size: int  # bytes as a registry stores them (compressed layers)
    build_seconds: float  # of the build that produced it (0 when it came from the cache)
    cached: bool

    @property
    def ref(self) -> str:
        """The reference pods use: by digest, so a node runs exactly this image."""
        return f"{self.repository}@{self.digest}"

    @property
    def tagged(self) -> str:
        return f"{self.repository}:{self.tag}"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "ref": self.ref, "tagged": self.tagged}


def _digest(parts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() + b"\0")
    return h.hexdigest()[:16]


def _recipe_parts(r: Recipe) -> list[str]:
    return [
        RECIPE_REV,
        r.name,
        r.suite,
        r.variant,
        *r.packages,
        *r.hooks,
        json.dumps(asdict(r.runtime), sort_keys=True),
        json.dumps(r.extra_inputs, sort_keys=True),
    ]


@contextlib.contextmanager
def _lock(root: Path) -> Iterator[None]:
    """One build at a time per cache (two labs coming up together share the work)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load(path: Path) -> BuiltImage | None:
    meta = path / "build.json"
    if not meta.exists():
        return None
    try:
        data = json.loads(meta.read_text())
        data.pop("ref", None)
        data.pop("tagged", None)
        img = BuiltImage(**{**data, "cached": True})
    except (ValueError, TypeError):
        return None
    return img if Path(img.layout).is_dir() else None


def _prune(root: Path, name: str, keep: Path) -> None:
    """Drop older builds of `name` (a changed input supersedes them)."""
    for old in root.glob(f"{name}-*"):
        if old != keep and old.is_dir() and old.name.rsplit("-", 1)[0] == name:
            shutil.rmtree(old, ignore_errors=True)


def image_tag(key: str) -> str:
    """`<release>-<content key>`: which autoheal built it (issue 19: one version for the package,
    the collection and the images), and which inputs, so two builds of one release never share a tag."""
    return f"{__version__}-{key[:12]}"


def _finish(recipe: Recipe, key: str, layout: Path, layers: list[oci.Layer], seconds: float) -> BuiltImage:
    tag = image_tag(key)
    man = oci.write_image(layout, layers, recipe.runtime, recipe.repository, tag=tag, version=__version__)
    img = BuiltImage(
        name=recipe.name,
        key=key,
        repository=recipe.repository,
        tag=tag,
        digest=man.digest,
        layout=str(layout),
        size=oci.image_size(layout),
        build_seconds=round(seconds, 1),
        cached=False,
    )
    (layout / "build.json").write_text(json.dumps(img.as_dict(), indent=1))
    return img


def _debian_layer(recipe: Recipe, root: Path, work: Path, layout: Path, hooks: Sequence[str]) -> oci.Layer:
    tar = work / f"{recipe.name}.tar"
    debian.mmdebstrap(
        recipe.suite,
        recipe.packages,
        tar,
        root / "debs" / recipe.suite,
        root / "logs" / f"{recipe.name}.log",
        variant=recipe.variant,
        hooks=hooks,
    )
    layer = oci.add_layer(layout, tar)
    tar.unlink()
    return layer


def _build_plain(recipe: Recipe, root: Path, progress: Progress) -> BuiltImage:
    # the release is an input: its number is in the tag and the manifest, so a new release rebuilds
    key = _digest([__version__, *_recipe_parts(recipe)])
    layout = root / f"{recipe.name}-{key}"
    if (img := _load(layout)) is not None:
        return img
    progress(f"building image {recipe.name} ({recipe.description})")
    t0 = time.monotonic()
    shutil.rmtree(layout, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=root) as work:
        layer = _debian_layer(recipe, root, Path(work), layout, recipe.hooks)
    img = _finish(recipe, key, layout, [layer], time.monotonic() - t0)
    _prune(root, recipe.name, layout)
    return img


def _runner_base(recipe: Recipe, root: Path, progress: Progress) -> tuple[Path, oci.Layer, float]:
    """The Debian + Python dependencies layer of the runner, cached under its own key."""
    proj = python.project_root()
    reqs, pins = python.requirements(proj), python.constraints()
    key = _digest([*_recipe_parts(recipe), PYTHON, *reqs, *pins, python.collections_version()])
    base = root / f"{recipe.name}-base-{key}"
    meta = base / "layer.json"
    if meta.exists():
        data = json.loads(meta.read_text())
        return base, oci.Layer(oci.Descriptor(**data["blob"]), data["diff_id"]), 0.0
    progress("building the runner's base layer (Debian, Python dependencies, Ansible collections)")
    t0 = time.monotonic()
    shutil.rmtree(base, ignore_errors=True)
    log = root / "logs" / f"{recipe.name}-base.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    with tempfile.TemporaryDirectory(dir=root) as work_s:
        work = Path(work_s)
        wheels, colls = work / "wheels", work / "collections"
        python.wheelhouse(wheels, reqs, pins, PYTHON, log)
        python.extract_collections(colls, log)
        site = f"/opt/autoheal/lib/python{PYTHON}/site-packages"
        hooks = [
            *recipe.hooks,
            # the image's Python must be the one the wheels were fetched for
            f'chroot "$1" python3 -c \'import sys; v="%d.%d" % sys.version_info[:2]; '
            f'sys.exit(0 if v == "{PYTHON}" else "python3 is " + v + ", wheels are for {PYTHON}")\'',
            f'cp -a {wheels} "$1"/tmp/wheels',
            'chroot "$1" python3 -m venv /opt/autoheal',
            'chroot "$1" /opt/autoheal/bin/pip install --quiet --no-index --no-cache-dir '
            "--find-links /tmp/wheels -r /tmp/wheels/requirements.txt -c /tmp/wheels/constraints.txt",
            # where the `ansible` package would have put them: ansible-core always searches there
            f'cp -a {colls}/ansible_collections "$1"{site}/',
            'rm -rf "$1"/tmp/wheels "$1"/etc/munge/munge.key',
        ]
        layer = _debian_layer(recipe, root, work, base, hooks)
    seconds = time.monotonic() - t0
    meta.write_text(json.dumps({"blob": asdict(layer.blob), "diff_id": layer.diff_id, "seconds": seconds}))
    _prune(root, f"{recipe.name}-base", base)
    return base, layer, seconds


def _build_runner(recipe: Recipe, root: Path, progress: Progress) -> BuiltImage:
    base, base_layer, base_seconds = _runner_base(recipe, root, progress)
    proj = python.project_root()
    key = _digest([__version__, base_layer.blob.digest, python.project_hash(proj)])
    layout = root / f"{recipe.name}-{key}"
    if (img := _load(layout)) is not None:
        return img
    progress("building the runner's project layer")
    t0 = time.monotonic()
    shutil.rmtree(layout, ignore_errors=True)
    oci.copy_layer(base, layout, base_layer)
    with tempfile.TemporaryDirectory(dir=root) as work:
        tar = Path(work) / "project.tar"
        python.project_layer(proj, PYTHON, tar, root / "logs" / f"{recipe.name}-project.log")
        top = oci.add_layer(layout, tar)
    img = _finish(recipe, key, layout, [base_layer, top], base_seconds + time.monotonic() - t0)
    _prune(root, recipe.name, layout)
    return img


def build(
    names: Sequence[str] | None = None,
    progress: Progress = _quiet,
    root: Path | None = None,
    rebuild: bool = False,
) -> list[BuiltImage]:
    """Build (or take from the cache) the named images, all by default, in recipe order."""
    root = root or cache_root()
    wanted = list(names) if names else list(RECIPES)
    known = {**RECIPES, **TEST_RECIPES}  # the test-only images are built when named
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise BuildError(f"images: unknown image {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    out: list[BuiltImage] = []
    with _lock(root):
        for name in wanted:
            recipe = known[name]
            if rebuild:
                for old in root.glob(f"{name}-*"):
                    shutil.rmtree(old, ignore_errors=True)
            try:
                img = (
                    _build_runner(recipe, root, progress)
                    if recipe.project_layer
                    else _build_plain(recipe, root, progress)
                )
            except BuildError:
                raise
            except (OSError, ValueError) as exc:
                raise BuildError(f"image {name}: {exc}; logs in {root / 'logs'}") from exc
            if not img.cached:
                progress(
                    f"image {name}: {img.ref} ({img.size / 1e6:.0f} MB) built in {img.build_seconds:.0f}s"
                )
            out.append(img)
    return out
