"""The suite's time budget: `make test` (the CI command) must end within 30 minutes on 2 cores.

Every issue adds tests on real kubelets; without a line that fails, the suite drifts towards CI's
hard limit (90 min) one minute at a time and nobody notices until a landing is lost. The line is
the pytest part of `make test`, whose target is 30 minutes less what runs before it (a fresh
clone's bootstrap, ~2.5 min with uv's cache warm; ruff, mypy with its cache warm and the
collection's sanity check, ~1 min).
A whole run fails only when it crosses the budget by MARGIN, so a busy machine's noise does not fail
it, and a real drift does. Runs of a part of the suite (paths, -k, -m, --lf) are not judged.

AUTOHEAL_SUITE_BUDGET_SECONDS sets another budget (0 turns the check off), for a slower machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

# What the suite held on this 2-core machine, not yet the 27 min that a 30-minute `make test`
# leaves it: in one process, fresh-clone runs took 43 min (913 tests) and 56 min (938, a
# virtualenv without compiled bytecode), CI 51.6 min, 2026-12-02; on two workers (tests/workers.py)
# 38.8 min (944 tests, 2026-12-03, Prometheus's rules no longer burning a third of a core in
# every lab; units still whole packages). The line catches drift; lower it as the suite gets faster.
BUDGET_SECONDS = 50 * 60
MARGIN = 0.15


@dataclass(frozen=True)
class Verdict:
    seconds: float
    budget: float
    over: bool

    @property
    def line(self) -> str:
        if self.budget <= 0:
            return f"suite time {self.seconds / 60:.1f} min (no budget: AUTOHEAL_SUITE_BUDGET_SECONDS=0)"
        limit = self.budget * (1 + MARGIN)
        head = f"suite time {self.seconds / 60:.1f} min of a {self.budget / 60:.0f} min budget"
        if self.over:
            return (
                f"{head}: OVER its limit of {limit / 60:.1f} min (budget + {MARGIN:.0%}). Find the time in "
                "the slowest durations above; share a lab where tests only read, poll instead of sleeping"
            )
        return f"{head} (fails above {limit / 60:.1f} min)"


def budget_seconds() -> float:
    raw = os.environ.get("AUTOHEAL_SUITE_BUDGET_SECONDS")
    if raw is None or raw == "":
        return float(BUDGET_SECONDS)
    try:
        return float(raw)
    except ValueError:
        raise pytest.UsageError(
            f"AUTOHEAL_SUITE_BUDGET_SECONDS={raw!r}: give seconds (e.g. 1620), or 0 to turn the check off"
        ) from None


def verdict(seconds: float, budget: float | None = None) -> Verdict:
    budget = budget_seconds() if budget is None else budget
    return Verdict(seconds, budget, budget > 0 and seconds > budget * (1 + MARGIN))


def is_whole_suite(config: pytest.Config) -> bool:
    """True for a run of every test the project has (no paths, -k, -m, --lf, --deselect or
    --collect-only)."""
    opt = config.option
    return (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not opt.collectonly
        and not opt.keyword
        and not opt.markexpr
        and not getattr(opt, "lf", False)
        and not getattr(opt, "deselect", None)
    )
