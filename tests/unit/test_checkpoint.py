"""The example job's checkpoints are atomic and a bad one is never loaded."""

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # the demo extra; bootstrap always installs it
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import checkpoint  # noqa: E402


def state(v):
    return {"w": torch.full((3,), float(v))}


def test_newest_valid_checkpoint_is_loaded(tmp_path):
    checkpoint.save(tmp_path, 10, state(1))
    checkpoint.save(tmp_path, 20, state(2))
    found = checkpoint.load_latest(tmp_path)
    assert found is not None
    step, s = found
    assert step == 20 and s["w"][0].item() == 2


def test_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    checkpoint.save(tmp_path, 10, state(1))
    p = checkpoint.save(tmp_path, 20, state(2))
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    found = checkpoint.load_latest(tmp_path)
    assert found is not None
    step, s = found
    assert step == 10 and s["w"][0].item() == 1
    assert "skipping checkpoint ckpt-00000020.pt: checksum mismatch" in caplog.text


def test_partial_checkpoint_without_manifest_is_skipped(tmp_path, caplog):
    checkpoint.save(tmp_path, 10, state(1))
    (tmp_path / "ckpt-00000030.pt").write_bytes(b"half a tens")  # killed before its manifest
    (tmp_path / ".ckpt-00000040.pt.tmp").write_bytes(b"never renamed")
    assert checkpoint.load_latest(tmp_path)[0] == 10
    assert "skipping checkpoint ckpt-00000030.pt" in caplog.text


def test_only_the_newest_few_are_kept(tmp_path):
    for step in range(1, 6):
        checkpoint.save(tmp_path, step, state(step), keep=2)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == ["ckpt-00000004.pt", "ckpt-00000005.pt"]


def test_empty_or_missing_directory_means_start_from_scratch(tmp_path):
    assert checkpoint.load_latest(tmp_path / "nope") is None
    assert checkpoint.load_latest(tmp_path) is None
