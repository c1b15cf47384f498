"""Write and read OCI image layouts (image-spec v1.1) without a container engine.

A layer is a gzip-compressed tar of a filesystem tree; the image is its config (the runtime
defaults: entrypoint, env, working dir, plus the diff IDs of the layers), a manifest naming the
config and layers by digest, and an index naming the manifest. Everything is content-addressed
by sha256, so the manifest digest is the image's identity: pods reference images by it.

Compression is deterministic (gzip with a zero mtime), so the same tar always yields the same
blob and the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
REF_NAME = "org.opencontainers.image.ref.name"
# containerd's `ctr images import` names an image from this annotation of the index entry
CONTAINERD_NAME = "io.containerd.image.name"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Layer:
    """A compressed layer blob and the digest of its uncompressed tar (the config's diff ID)."""

    blob: Descriptor
    diff_id: str


@dataclass(frozen=True)
class RuntimeConfig:
    """What a container of the image runs when the pod does not say otherwise."""

    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: list[str] = field(
        default_factory=lambda: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    )
    working_dir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


def blob_path(layout: Path, digest: str) -> Path:
    algo, _, hexd = digest.partition(":")
    return layout / "blobs" / algo / hexd


def init_layout(layout: Path) -> None:
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))


def _put_bytes(layout: Path, data: bytes, media_type: str) -> Descriptor:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = blob_path(layout, digest)
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return Descriptor(media_type, digest, len(data))


def _put_json(layout: Path, obj: dict[str, Any], media_type: str) -> Descriptor:
    # canonical enough to be stable: sorted keys, no whitespace
    return _put_bytes(layout, json.dumps(obj, sort_keys=True, separators=(",", ":")).encode(), media_type)


class _HashingWriter:
    """A file that hashes and counts what passes through it (the compressed side of a layer)."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("wb")
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def add_layer(layout: Path, tar: Path, level: int = 6) -> Layer:
    """Compress `tar` into a layer blob of `layout` in one pass (both digests computed on the way)."""
    init_layout(layout)
    tmp = layout / "blobs" / "sha256" / f".{tar.name}.partial"
    out = _HashingWriter(tmp)
    diff = hashlib.sha256()
    try:
        # mtime=0 and no file name in the header: the same tar always gives the same blob
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=level, mtime=0) as gz,
            tar.open("rb") as src,
        ):
            while chunk := src.read(_CHUNK):
                diff.update(chunk)
                gz.write(chunk)
    finally:
        out.close()
    digest = "sha256:" + out.sha.hexdigest()
    tmp.replace(blob_path(layout, digest))
    return Layer(Descriptor(LAYER_GZIP, digest, out.size), "sha256:" + diff.hexdigest())


def write_image(
    layout: Path, layers: list[Layer], runtime: RuntimeConfig, name: str, tag: str, version: str = ""
) -> Descriptor:
    """Write config, manifest and index for `layers`; return the manifest's descriptor.

    `name` is the fully qualified repository (e.g. ``localhost/autoheal/slurm``): CRI looks images up
    by their normalised name, so a short name would be searched under docker.io.
    """
    config: dict[str, Any] = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": runtime.env,
            "WorkingDir": runtime.working_dir,
            **({"Entrypoint": runtime.entrypoint} if runtime.entrypoint else {}),
            **({"Cmd": runtime.cmd} if runtime.cmd else {}),
            **({"Labels": runtime.labels} if runtime.labels else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        # no "created" timestamp: the digest depends only on the content
        "history": [{"created_by": "autoheal images build"} for _ in layers],
    }
    cfg = _put_json(layout, config, CONFIG)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": cfg.as_dict(),
        "layers": [layer.blob.as_dict() for layer in layers],
        "annotations": {
            "org.opencontainers.image.title": name,
            **({"org.opencontainers.image.version": version} if version else {}),
        },
    }
    man = _put_json(layout, manifest, MANIFEST)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {
                **man.as_dict(),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {REF_NAME: tag, CONTAINERD_NAME: f"{name}:{tag}"},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index, indent=1))
    return man


def read_manifest(layout: Path) -> tuple[Descriptor, dict[str, Any]]:
    """The single manifest of a layout written by `write_image`."""
    index = json.loads((layout / "index.json").read_text())
    entry = index["manifests"][0]
    desc = Descriptor(entry["mediaType"], entry["digest"], entry["size"])
    return desc, json.loads(blob_path(layout, desc.digest).read_text())


def verify(layout: Path) -> None:
    """Check that every blob the manifest names exists with its digest (a cache entry is whole)."""
    desc, manifest = read_manifest(layout)
    for d in [desc.as_dict(), manifest["config"], *manifest["layers"]]:
        path = blob_path(layout, d["digest"])
        if not path.exists() or path.stat().st_size != d["size"]:
            raise ValueError(f"{layout}: blob {d['digest']} is missing or truncated")
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        if "sha256:" + h.hexdigest() != d["digest"]:
            raise ValueError(f"{layout}: blob {d['digest']} does not match its digest")


def image_size(layout: Path) -> int:
    """Bytes of the image as a registry stores it: config + compressed layers + manifest."""
    desc, manifest = read_manifest(layout)
    return desc.size + int(manifest["config"]["size"]) + sum(int(x["size"]) for x in manifest["layers"])


def copy_layer(src_layout: Path, dst_layout: Path, layer: Layer) -> None:
    """Reuse a cached layer blob in another layout (a hard link when the filesystem allows)."""
    init_layout(dst_layout)
    src, dst = blob_path(src_layout, layer.blob.digest), blob_path(dst_layout, layer.blob.digest)
    if dst.exists():
        return
    try:
        dst.hardlink_to(src)
    except OSError:
        shutil.copyfile(src, dst)
