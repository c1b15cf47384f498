"""Suite-wide guards: enough free disk before the first test, and the suite's time budget after the
last (tests/budget.py says why and how the line is drawn)."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from autoheal.errors import LabError
from lab import disk
from tests import budget

REPO = Path(__file__).resolve().parents[1]
_STARTED = pytest.StashKey[float]()
_VERDICT = pytest.StashKey[budget.Verdict]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()
    # the labs of the tests live under pytest's temporary folders; `autoheal lab up` under .lab/
    lab_root = Path(os.environ.get("AUTOHEAL_LAB_ROOT", REPO / ".lab"))
    try:
        disk.require_free(Path(tempfile.gettempdir()), disk.SUITE_BYTES, "the test suite", [lab_root])
    except LabError as exc:
        pytest.exit(f"not starting: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Runs before the terminal summary: the verdict is printed there, and an over-budget whole
    run fails even when every test passed."""
    config = session.config
    started = config.stash.get(_STARTED, None)
    if started is None or not budget.is_whole_suite(config):
        return
    verdict = budget.verdict(time.monotonic() - started)
    config.stash[_VERDICT] = verdict
    if verdict.over and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    verdict = terminalreporter.config.stash.get(_VERDICT, None)
    if verdict is not None:
        terminalreporter.write_sep("=", "suite time budget", red=verdict.over, green=not verdict.over)
        terminalreporter.write_line(verdict.line)
