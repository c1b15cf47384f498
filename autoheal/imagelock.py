"""The image lock file: the references by digest `autoheal images build` produced, for the stack.

A tag can move under a running pool, so the stack names its images by digest (the policy rule
`images-pinned-by-digest` refuses anything else). The digests are only known after a build (and a
push gives them another registry's name), so the builder records them here and the stack takes
them as its default images, the way a package manager's lock file pins what was resolved:

    {"version": 1, "images": {"slurm": "repo@sha256:...", "runner": "...", "pause": "..."}}

The file lives in the Pulumi project folder (`images.lock.json`, git-ignored: digests belong to a
build and a registry, not to the source). The builder writes it and the stack's `__main__.py`
reads it; both sit above the core, which is why the format lives here and in neither.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoheal.errors import ConfigError

LOCK_FILE = "images.lock.json"
LOCK_VERSION = 1
_HEX = frozenset("0123456789abcdef")


def pinned_by_digest(image: str) -> bool:
    """`repo@sha256:<64 hex>`: the registry cannot hand a node something else under that name."""
    repo, at, digest = image.partition("@")
    algo, _, hex_ = digest.partition(":")
    return bool(repo) and bool(at) and algo == "sha256" and len(hex_) == 64 and set(hex_) <= _HEX


def _images(path: Path, doc: Any) -> dict[str, str]:
    """The validated `images` of a decoded lock file; ConfigError naming the file and the key."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: expected a JSON object {{'version': 1, 'images': {{...}}}}")
    unknown = sorted(set(doc) - {"version", "images"})
    if unknown:
        raise ConfigError(f"{path}: {unknown[0]}: unknown key (a lock file has version and images)")
    if doc.get("version") != LOCK_VERSION:
        raise ConfigError(
            f"{path}: version: expected {LOCK_VERSION}, got {doc.get('version')!r} "
            "(rebuild it with `autoheal images build`)"
        )
    images = doc.get("images")
    if not isinstance(images, Mapping):
        raise ConfigError(f"{path}: images: expected an object (image name -> reference by digest)")
    out: dict[str, str] = {}
    for name, ref in images.items():
        if not isinstance(ref, str) or not pinned_by_digest(ref):
            raise ConfigError(
                f"{path}: images.{name}: expected a reference by digest (repo@sha256:<64 hex>), "
                f"got {ref!r:.80}"
            )
        out[str(name)] = ref
    return out


def read_lock(path: Path) -> dict[str, str] | None:
    """Image name -> reference by digest; None when there is no lock file (no build recorded)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the image lock file: {exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    return _images(path, doc)


def write_lock(path: Path, images: Mapping[str, str]) -> dict[str, str]:
    """Record `images` (name -> reference by digest) in the lock file and return what it now holds.

    Entries of images not built this time are kept (`--image runner` must not forget the slurm
    image); a lock file that cannot be read is replaced, since this is its writer. Written to a
    temporary file beside it and renamed, so a reader (a preview running meanwhile) sees the old
    lock or the new one, never half of one.
    """
    bad = {n: r for n, r in images.items() if not pinned_by_digest(r)}
    if bad:  # the builder's own bug: never record a reference the stack would be refused
        raise ValueError(f"image lock: not references by digest: {bad}")
    try:
        merged = {**(read_lock(path) or {}), **images}
    except ConfigError:
        merged = dict(images)
    text = json.dumps({"version": LOCK_VERSION, "images": dict(sorted(merged.items()))}, indent=2) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it from a CI job's other users
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot write the image lock file: {exc} "
            "(choose another: `autoheal images build --lock PATH`)"
        ) from exc
    return merged
