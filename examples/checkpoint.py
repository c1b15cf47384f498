"""Atomic, verifiable checkpoints for the example training job.

A checkpoint is `ckpt-<step>.pt` plus a manifest `ckpt-<step>.json` holding its SHA-256. Both are
written to a temporary name, fsynced and renamed, and the manifest goes last: a checkpoint without a
manifest, or whose bytes do not match it, was cut short or corrupted and is skipped with a warning,
never loaded. Nothing here needs a GPU.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("checkpoint")
NAME = re.compile(r"^ckpt-(\d{8})\.pt$")


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def save(directory: Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = directory / f"ckpt-{step:08d}.pt"
    _atomic_write(path, data)
    manifest = {"step": step, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    _atomic_write(path.with_suffix(".json"), json.dumps(manifest).encode())
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)  # the renames themselves survive a crash
    finally:
        os.close(dfd)
    for old in sorted(directory.glob("ckpt-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)
    return path


def load_latest(directory: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that verifies, or None. Bad ones are skipped with a warning."""
    if not directory.is_dir():
        return None
    candidates = sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := NAME.match(p.name)))
    for step, path in reversed(candidates):
        try:
            manifest = json.loads(path.with_suffix(".json").read_text())
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != manifest["sha256"] or manifest["step"] != step:
                raise ValueError("checksum mismatch")
            state = torch.load(io.BytesIO(data), weights_only=True)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            log.warning("skipping checkpoint %s: %s", path.name, exc)
            continue
        return step, state
    return None
