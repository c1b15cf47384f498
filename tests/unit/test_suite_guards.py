"""The suite's own guards: a whole run over its time budget fails, a part of it is never judged,
and too little free disk stops a lab (and the suite) before anything starts, naming what to clean;
and `make test`'s workers share the suite by work units without building a lab twice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from autoheal.errors import LabError
from lab import disk
from tests import budget, workers

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


def _run_suite(
    tmp_path: Path, budget_s: str, *args: str, env: dict[str, str] | None = None, test: str = ""
) -> subprocess.CompletedProcess[str]:
    """A tiny suite with the project's guards (tests/conftest.py as a plugin) and testpaths."""
    (tmp_path / "t").mkdir(exist_ok=True)
    test = test or "import time\n\ndef test_a():\n    time.sleep(0.3)\n"
    (tmp_path / "t" / "test_x.py").write_text(test)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = t\n")
    env = {
        **(os.environ if env is None else env),
        "PYTHONPATH": str(REPO),
        "AUTOHEAL_SUITE_BUDGET_SECONDS": budget_s,
        "AUTOHEAL_CACHE": str(tmp_path),  # its unit times are not the suite's
    }
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


SCRATCH_TEST = """
import os, subprocess, sys, tempfile

def test_b():
    fd, path = tempfile.mkstemp(prefix="left-")
    # a child process (a lab daemon, a play) puts its files in the same folder
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp())"],
                           capture_output=True, text=True, check=True).stdout.strip()
    with open(os.environ["SCRATCH_REPORT"], "w") as f:  # outside the folder: the test reads it
        f.write(" ".join([path, child, os.environ["ANSIBLE_LOCAL_TEMP"], os.environ["ANSIBLE_REMOTE_TEMP"]]))
    assert path.startswith(os.environ["AUTOHEAL_TEST_SCRATCH"] + "/")
    assert child.startswith(os.environ["AUTOHEAL_TEST_SCRATCH"] + "/")
"""


def test_a_run_keeps_its_temporary_files_in_one_folder_that_its_end_removes(tmp_path: Path) -> None:
    system_tmp = tmp_path / "systmp"
    system_tmp.mkdir()
    ours = (disk.SCRATCH_ENV, "ANSIBLE_LOCAL_TEMP", "ANSIBLE_REMOTE_TEMP")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(TMPDIR=str(system_tmp), SCRATCH_REPORT=str(tmp_path / "files"))
    # two workers: they, and what they start, use the folder their controller made
    res = _run_suite(tmp_path, "600", "-n", "2", env=env, test=SCRATCH_TEST)
    assert res.returncode == 0, res.stdout + res.stderr
    files = (tmp_path / "files").read_text().split()
    assert len(files) == 4 and not any(Path(f).exists() for f in files), files
    assert all(f.startswith(f"{system_tmp}/{disk.SCRATCH_PREFIX}") for f in files), files
    assert list(system_tmp.iterdir()) == []  # pytest's own folders went with it
    kept = _run_suite(tmp_path, "600", env={**env, "AUTOHEAL_KEEP_TMP": "1"}, test=SCRATCH_TEST)
    assert kept.returncode == 0 and "is kept (AUTOHEAL_KEEP_TMP=1)" in kept.stderr, kept.stderr
    assert [d.name[: len(disk.SCRATCH_PREFIX)] for d in system_tmp.iterdir()] == [disk.SCRATCH_PREFIX]


def test_a_killed_runs_folder_is_a_leftover_and_a_live_runs_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv(disk.SCRATCH_ENV, raising=False)
    monkeypatch.setattr("tempfile.tempdir", None)
    live, dead = tmp_path / f"{disk.SCRATCH_PREFIX}live", tmp_path / f"{disk.SCRATCH_PREFIX}dead"
    for d in (live, dead):
        d.mkdir()
        (d / "payload").write_bytes(b"\0" * (2 << 20))
    (live / disk.SCRATCH_OWNER).write_text(disk.scratch_owner())
    (dead / disk.SCRATCH_OWNER).write_text(f"{os.getpid()} 1\n")  # this PID, another start: reused
    assert disk.stale_scratch() == [dead]
    assert [x.path for x in disk.leftovers([])] == [dead]
    # inside a run, the system's temp dir is its folder's parent
    monkeypatch.setenv(disk.SCRATCH_ENV, str(live))
    monkeypatch.setenv("TMPDIR", str(live))
    assert disk.system_temp() == tmp_path and disk.stale_scratch() == [dead]


def test_a_lab_needs_more_disk_for_each_real_node() -> None:
    assert disk.lab_need(3) - disk.lab_need(0) == 3 * disk.REAL_NODE_BYTES


# --- how `make test`'s workers share the suite (tests/workers.py) ---


def test_the_modules_sharing_a_packages_lab_are_one_unit_and_every_other_module_its_own() -> None:
    assert workers.unit_of("tests/runbook/test_modules.py::test_x[a]") == "tests/runbook"
    assert workers.unit_of("tests/runbook/test_ladder.py::T::test_z") == "tests/runbook"
    # a module of the same package that does not use its lab goes its own way (molecule has its own)
    assert workers.unit_of("tests/runbook/test_molecule.py::t") == "tests/runbook/test_molecule.py"
    assert workers.unit_of("tests/unit/test_backoff.py::test_a") == "tests/unit/test_backoff.py"


def test_measured_unit_times_sum_every_phase_and_survive_a_round_trip(tmp_path: Path) -> None:
    times = workers.measured(
        [
            ("tests/lab/test_lab_pool.py::t", 1.0),
            ("tests/lab/test_lab_slurm.py::t", 2.5),
            ("tests/unit/test_c.py::t", 0.25),
        ]
    )
    assert times == {
        "tests/lab/test_lab_pool.py": 1.0,
        "tests/lab/test_lab_slurm.py": 2.5,
        "tests/unit/test_c.py": 0.2,
    }
    path = tmp_path / "cache" / "units.json"
    workers.save_times(times, path)
    assert workers.load_times(path) == times
    path.write_text("not json")
    assert workers.load_times(path) == {}  # a damaged record only costs the ordering


def test_each_worker_moves_its_ports_below_the_blocks_and_refuses_a_fourth(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert workers.port_shift() == 0
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert workers.port_shift() == -workers.PORT_STRIDE
    # the highest block (29,300) of the last worker stays clear of the ones below it, above 1,024
    assert 21_400 - workers.PORT_STRIDE * (workers.MAX_WORKERS - 1) > 1024
    # the shift reaches what the worker starts through the variable, added once
    monkeypatch.setenv(workers.PORT_OFFSET_ENV, "500")
    monkeypatch.setenv(workers._EXPORTED, "")  # recorded, so the test leaves it as it was
    workers.export_port_offset()
    workers.export_port_offset()
    assert os.environ[workers.PORT_OFFSET_ENV] == str(500 - workers.PORT_STRIDE)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{workers.MAX_WORKERS}")
    with pytest.raises(pytest.UsageError, match="at most 3 workers"):
        workers.port_shift()


def _tiny_suite(tmp_path: Path, shared: bool) -> None:
    """Two modules sharing a package-scoped fixture (tests/lab's, as SHARED lists them) and a module
    on its own; each test records the worker it ran on."""
    # no __init__.py: the project's `tests` package (its conftest is the plugin) must stay importable
    for pkg in ("tests/lab", "tests/unit"):
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
    scope = "package" if shared else "function"
    (tmp_path / "tests/lab/conftest.py").write_text(
        f"import pytest\n\n@pytest.fixture(scope='{scope}')\ndef lab():\n    return 1\n"
    )
    body = (
        "import os\n\ndef _mark(name):\n"
        "    with open(os.environ['RECORD'], 'a') as f:\n"
        "        f.write(name + ' ' + os.environ['PYTEST_XDIST_WORKER'] + '\\n')\n"
    )
    for mod in ("test_lab_pool", "test_lab_slurm"):
        tests = "".join(f"\ndef test_{i}(lab):\n    _mark('{mod}')\n" for i in range(3))
        (tmp_path / "tests/lab" / f"{mod}.py").write_text(body + tests)
    (tmp_path / "tests/unit/test_c.py").write_text(body + "\ndef test_c():\n    _mark('c')\n")


def test_two_workers_run_a_shared_package_on_one_worker(tmp_path: Path) -> None:
    _tiny_suite(tmp_path, shared=True)
    record = tmp_path / "record"
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECORD": str(record), "AUTOHEAL_CACHE": str(tmp_path)}
    env.pop("AUTOHEAL_TEST_PORT_OFFSET", None)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2",
         "--import-mode=importlib", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert res.returncode == 0 and "7 passed" in res.stdout, res.stdout + res.stderr
    ran = [line.split() for line in record.read_text().splitlines()]
    assert len({w for m, w in ran if m.startswith("test_lab")}) == 1, ran  # the lab's unit
    assert {m for m, _ in ran} == {"test_lab_pool", "test_lab_slurm", "c"}


def test_a_package_scoped_fixture_outside_the_table_stops_the_run_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_suite(tmp_path, shared=True)
    (tmp_path / "tests/unit/conftest.py").write_text(
        "import pytest\n\n@pytest.fixture(scope='package')\ndef lab():\n    return 2\n"
    )
    (tmp_path / "tests/unit/test_c.py").write_text("def test_c(lab):\n    assert lab == 2\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RECORD": str(tmp_path / "r"),
        "AUTOHEAL_CACHE": str(tmp_path),
    }
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-n", "2",
         "--import-mode=importlib", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert res.returncode != 0, res.stdout
    assert "tests/unit/test_c.py (uses a fixture of tests/unit): add the module" in res.stdout + res.stderr


def test_the_longest_units_go_first_keeping_each_units_own_order() -> None:
    ids = [
        "tests/unit/test_a.py::t1",
        "tests/lab/test_lab_pool.py::t1",
        "tests/unit/test_a.py::t2",
        "tests/e2e/test_demo.py::t",
        "tests/lab/test_lab_slurm.py::t2",
        "tests/unit/test_b.py::t",
    ]
    items = [cast(pytest.Item, SimpleNamespace(nodeid=i)) for i in ids]
    # measured seconds where known (the demo's one test is the longest), else the number of tests
    # the lab's unit weighs its two modules' records (20 + 20 s)
    times = {
        "tests/e2e/test_demo.py": 300.0,
        "tests/lab/test_lab_pool.py": 20.0,
        "tests/lab/test_lab_slurm.py": 20.0,
    }
    workers.order(items, times)
    assert [i.nodeid for i in items] == [
        "tests/e2e/test_demo.py::t",
        "tests/lab/test_lab_pool.py::t1",
        "tests/lab/test_lab_slurm.py::t2",
        "tests/unit/test_a.py::t1",
        "tests/unit/test_a.py::t2",
        "tests/unit/test_b.py::t",
    ]
