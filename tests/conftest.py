"""Suite-wide guards: enough free disk before the first test, and the suite's time budget after the
last (tests/budget.py says why and how the line is drawn); how `make test`'s workers share the
suite (tests/workers.py); and one temporary folder for the whole run, removed at its end
(tests/scratch.py)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from autoheal.errors import LabError
from lab import disk
from tests import budget, scratch, workers

REPO = Path(__file__).resolve().parents[1]
_STARTED = pytest.StashKey[float]()
_VERDICT = pytest.StashKey[budget.Verdict]()
_TIMES = "autoheal_test_times"  # the last whole run's seconds per module, handed to each worker
_LOADED_TIMES = pytest.StashKey[dict[str, float]]()
_SCRATCH = pytest.StashKey[Path]()


workers.export_port_offset()  # before any test module reads it


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # before pytest makes its own temporary folder, and before xdist starts the workers (which
    # inherit it)
    path = scratch.enter()
    if path is not None:
        config.stash[_SCRATCH] = path


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_SCRATCH, None)
    line = scratch.leave(path) if path is not None else None
    if line:
        print(line, file=sys.stderr)


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()
    # the labs of the tests live under pytest's temporary folders; `autoheal lab up` under .lab/
    lab_root = Path(os.environ.get("AUTOHEAL_LAB_ROOT", REPO / ".lab"))
    try:
        disk.require_free(Path(tempfile.gettempdir()), disk.SUITE_BYTES, "the test suite", [lab_root])
    except LabError as exc:
        pytest.exit(f"not starting: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: every worker orders the suite from the same recorded times (read
    once, so that a file written meanwhile cannot give two workers two orders)."""
    stash = node.config.stash
    if _LOADED_TIMES not in stash:
        stash[_LOADED_TIMES] = workers.load_times()
    node.workerinput[_TIMES] = stash[_LOADED_TIMES]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return workers.UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _is_worker(config):
        workers.check_shared(items)
        workers.order(items, config.workerinput.get(_TIMES, {}))  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Runs before the terminal summary: the verdict is printed there, and an over-budget whole
    run fails even when every test passed. Workers leave both to the controller."""
    config = session.config
    started = config.stash.get(_STARTED, None)
    if started is None or _is_worker(config) or not budget.is_whole_suite(config):
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reports = [r for found in (reporter.stats.values() if reporter else ()) for r in found]
    # the next distributed run starts its longest units first
    measured = workers.measured((r.nodeid, r.duration) for r in reports if hasattr(r, "duration"))
    workers.save_times({**workers.load_times(), **measured})
    verdict = budget.verdict(time.monotonic() - started)
    config.stash[_VERDICT] = verdict
    if verdict.over and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    verdict = terminalreporter.config.stash.get(_VERDICT, None)
    if verdict is not None:
        terminalreporter.write_sep("=", "suite time budget", red=verdict.over, green=not verdict.over)
        terminalreporter.write_line(verdict.line)
