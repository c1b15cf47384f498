"""A real node refuses to start on a disk its kubelet would call under pressure, and a node that
stops leaves no image store behind (the suite once filled the host's disk with 45 GB of them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from autoheal.errors import LabError
from images.build import BuiltImage
from lab.nodes import files, node


def _image(size: int) -> BuiltImage:
    return BuiltImage("slurm", "k", "ghcr.io/autoheal/slurm", "t", "sha256:0", "/x", size, 0.0, True)


def test_a_node_starts_only_where_its_store_fits_above_the_eviction_floor(tmp_path: Path) -> None:
    paths = files.NodePaths(tmp_path / "gpu-1", tmp_path / "n0")
    paths.dir.mkdir()
    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    node.check_disk(paths, [_image(1 << 20)])  # 1 MiB of images fits on any disk that runs this
    with pytest.raises(LabError) as err:
        node.check_disk(paths, [_image(free // node.STORE_PER_IMAGE_BYTE + 1)])
    msg = str(err.value)
    assert msg.startswith("node gpu-1: the disk under")
    assert f"evictionHard {files.EVICTION_DISK_PERCENT}%" in msg
    assert "/tmp/pytest-of-*" in msg


def test_the_kubelet_evicts_at_the_floor_the_check_uses(tmp_path: Path) -> None:
    paths = files.NodePaths(tmp_path / "gpu-1", tmp_path / "n0")
    conf = files.kubelet_config(paths, "10.0.0.2", "lab/gpu-1", [], tmp_path / "ca.crt")
    assert yaml.safe_load(conf)["evictionHard"]["imagefs.available"] == f"{files.EVICTION_DISK_PERCENT}%"


def test_discarding_a_store_keeps_the_logs(tmp_path: Path) -> None:
    node_dir = node.nodes_dir(tmp_path) / "gpu-1"
    (node_dir / files.CONTAINERD_DIR / "root" / "snapshots").mkdir(parents=True)
    (node_dir / "pod-logs").mkdir()
    node.discard_store(tmp_path, "gpu-1", running={node.proc_name("gpu-1", "holder")})
    assert (node_dir / files.CONTAINERD_DIR).is_dir()  # its holder still runs: the mounts are live
    node.discard_store(tmp_path, "gpu-1")
    assert sorted(p.name for p in node_dir.iterdir()) == ["pod-logs"]
