"""Drift: the shipped catalogue against NVIDIA's table, kept as data (tests/data/nvidia_xid_buckets.yaml).

Fails when an XID of NVIDIA's table is missing from the catalogue, when its bucket differs, or when
the catalogue lists an XID NVIDIA's table does not (an invented entry would hide the fail-safe).
"""

from pathlib import Path

import yaml

from autoheal.xid import Bucket, load_catalog

NVIDIA = Path(__file__).resolve().parents[1] / "data" / "nvidia_xid_buckets.yaml"


def _nvidia() -> dict[int, str]:
    data = yaml.safe_load(NVIDIA.read_text())
    return {int(k): str(v) for k, v in data["buckets"].items()}


def test_catalogue_matches_nvidias_table_entry_by_entry():
    cat = load_catalog()
    ours = {e.xid: e.bucket.value for e in cat.xids}
    theirs = _nvidia()
    drift = {
        x: (ours.get(x, "<missing>"), theirs.get(x, "<not in NVIDIA's table>"))
        for x in sorted(set(ours) | set(theirs))
        if ours.get(x) != theirs.get(x)
    }
    assert drift == {}, f"catalogue drifted from NVIDIA's table (ours, NVIDIA's): {drift}"


def test_the_source_version_is_recorded_and_matches():
    cat = load_catalog()
    assert cat.source == yaml.safe_load(NVIDIA.read_text())["source"]
    assert cat.version >= 4


def test_nvidias_table_uses_only_known_buckets():
    assert set(_nvidia().values()) <= {b.value for b in Bucket}


def test_the_drift_test_can_fail(tmp_path):
    """A catalogue entry changed by hand is caught (the comparison is not vacuous)."""
    cat = load_catalog()
    ours = {e.xid: e.bucket.value for e in cat.xids}
    ours[79] = "RESET_GPU"
    assert ours != _nvidia()
