"""The suite's own guards: a whole run over its time budget fails, a part of it is never judged,
and too little free disk stops a lab (and the suite) before anything starts, naming what to clean."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoheal.errors import LabError
from lab import disk
from tests import budget

REPO = Path(__file__).resolve().parents[2]


def test_the_verdict_fails_only_past_the_budget_and_its_margin() -> None:
    assert not budget.verdict(1000, 1000).over
    assert not budget.verdict(1000 * (1 + budget.MARGIN) - 1, 1000).over
    over = budget.verdict(1000 * (1 + budget.MARGIN) + 1, 1000)
    assert over.over and "OVER" in over.line and "slowest durations" in over.line
    assert not budget.verdict(10**6, 0).over  # 0: off


def test_a_bad_budget_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOHEAL_SUITE_BUDGET_SECONDS", "half an hour")
    with pytest.raises(pytest.UsageError, match="AUTOHEAL_SUITE_BUDGET_SECONDS='half an hour'"):
        budget.budget_seconds()


def _run_suite(tmp_path: Path, budget_s: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A tiny suite with the project's guards (tests/conftest.py as a plugin) and testpaths."""
    (tmp_path / "t").mkdir(exist_ok=True)
    (tmp_path / "t" / "test_x.py").write_text("import time\n\ndef test_a():\n    time.sleep(0.3)\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = t\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "AUTOHEAL_SUITE_BUDGET_SECONDS": budget_s}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_whole_run_over_its_budget_fails_though_every_test_passed(tmp_path: Path) -> None:
    res = _run_suite(tmp_path, "0.1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 passed" in res.stdout and "OVER its limit" in res.stdout, res.stdout
    ok = _run_suite(tmp_path, "600")
    assert ok.returncode == 0 and "of a 10 min budget" in ok.stdout, ok.stdout + ok.stderr
    part = _run_suite(tmp_path, "0.1", "-k", "test_a")  # a part of the suite is not judged
    assert part.returncode == 0 and "suite time" not in part.stdout, part.stdout + part.stderr
    listed = _run_suite(tmp_path, "0.1", "--collect-only")  # nor is a listing
    assert listed.returncode == 0 and "suite time" not in listed.stdout, listed.stdout + listed.stderr


def test_too_little_disk_is_refused_naming_what_to_clean(tmp_path: Path) -> None:
    labs = tmp_path / "labs"
    old = labs / "old-lab" / "nodes" / "gpu-1"
    old.mkdir(parents=True)
    (old / "store").write_bytes(b"\0" * (2 << 20))
    disk.require_free(tmp_path, 1, "a small thing", [labs])  # fits on any disk that runs this
    free = disk.free_bytes(tmp_path)
    with pytest.raises(LabError) as err:
        disk.require_free(tmp_path, free + disk.GIB, "lab 'x'", [labs])
    msg = str(err.value)
    assert msg.startswith("lab 'x' needs ~") and str(tmp_path) in msg, msg
    assert f"{labs / 'old-lab'} (0.0 GiB)" in msg and "autoheal lab down" in msg, msg


def test_a_lab_needs_more_disk_for_each_real_node() -> None:
    assert disk.lab_need(3) - disk.lab_need(0) == 3 * disk.REAL_NODE_BYTES
