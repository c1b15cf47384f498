"""How `make test` shares the suite between its workers (pytest-xdist, `-n 2`).

Most of the suite waits on real parts (slurmctld's pings, kubelets, the Pulumi engine, Ansible's
forks): run in one process it kept 2 cores about half busy. Two workers run two work units at once.

- A work unit runs on one worker from its first test to its last. The modules of a package whose
  tests share a fixture of package scope (a lab) are one unit (SHARED), so no lab is built twice;
  every other module is a unit of its own. UnitScheduling is xdist's scope scheduling with these units
  as its scopes (xdist's own `loadgroup` marks are not used: they rewrite node ids, which pytest
  9.2 no longer allows, pytest-xdist#1386). The controller sees node ids only, so SHARED is a
  table; each worker checks it against the fixtures it collected and stops the run when a
  module using a package-scoped fixture is missing from it.
- The longest units start first, so that no long unit is left to start last while the other
  worker idles: the seconds of their modules in the last whole run on this machine (TIMES, kept
  with the other caches outside the clone), else their number of tests.
- Each worker shifts the suite's fixed port blocks (tests/support.port_base) by PORT_STRIDE per
  worker index, downwards: the blocks lie between 21,400 and 30,000 and the ephemeral range starts
  at 32,768, so only the range below is free for a second copy.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from images.build import cache_root

# The modules whose tests share a package's fixture (its lab), by package: each package's listed
# modules are one work unit. Checked by every worker against what it collected (check_shared).
SHARED: dict[str, tuple[str, ...]] = {
    "tests/components": (
        "test_monitoring.py",
        "test_nodepool.py",
        "test_policy_digest.py",
        "test_runner.py",
        "test_slurm.py",
        "test_stack.py",
        "test_xid_watcher.py",
    ),
    "tests/k8s_runner": (
        "test_cordon_sync.py",
        "test_fleet_loops.py",
        "test_incluster.py",
        "test_lending_limits.py",
        "test_rbac.py",
    ),
    "tests/lab": ("test_example_job.py", "test_lab_alerts.py", "test_lab_pool.py", "test_lab_slurm.py"),
    "tests/nodes": (
        "test_burst_service.py",
        "test_evidence_real.py",
        "test_ladder_jobs.py",
        "test_preflight_real.py",
        "test_real_nodes.py",
        "test_xid_watcher_kmsg.py",
    ),
    "tests/packaging": ("test_collection.py", "test_version.py", "test_wheel.py"),
    "tests/remediation": ("test_rem_journal_pg.py",),
    "tests/runbook": (
        "test_ladder.py",
        "test_modules.py",
        "test_playbooks.py",
        "test_slurm_outage.py",
        "test_warm_fence.py",
    ),
}
_SHARED_BY_MODULE = {f"{pkg}/{mod}": pkg for pkg, mods in SHARED.items() for mod in mods}
PORT_STRIDE = 10_000
PORT_OFFSET_ENV = "AUTOHEAL_TEST_PORT_OFFSET"
_EXPORTED = (
    "AUTOHEAL_TEST_PORT_SHIFTED"  # a worker's own pytest runs (tests of these guards) shift no further
)
MAX_WORKERS = 3  # the third worker's blocks start at 1,400: a fourth would go below 1,024
TIMES = cache_root().parent / "test-times.json"
_SHARED_SCOPES = ("package", "session")


def worker_index() -> int:
    """0 for the first worker, or when pytest runs without workers."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    if index >= MAX_WORKERS:
        raise pytest.UsageError(
            f"pytest -n: at most {MAX_WORKERS} workers fit the suite's port blocks (worker {name})"
        )
    return index


def port_shift() -> int:
    return -PORT_STRIDE * worker_index()


def export_port_offset() -> None:
    """Add this worker's shift to $AUTOHEAL_TEST_PORT_OFFSET, once, at the worker's start: the
    suite's port blocks (tests/support.port_base) and what the tests start (a molecule scenario
    reads the variable itself) then move together."""
    shift = port_shift()
    if shift and not os.environ.get(_EXPORTED):
        base = int(os.environ.get(PORT_OFFSET_ENV, "0"))
        os.environ[PORT_OFFSET_ENV] = str(base + shift)
        os.environ[_EXPORTED] = "1"


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The test's package when its module shares the package's fixture (SHARED), else its module."""
    module = _module(nodeid)
    return _SHARED_BY_MODULE.get(module, module)


def shared_scope(item: pytest.Item) -> str | None:
    """The package of the suite declaring a package- or session-scoped fixture the test uses, if
    any (pytest's and plugins' own fixtures, declared outside the suite, have no such package)."""
    # pytest keeps the resolved fixture definitions only on this private attribute
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope in _SHARED_SCOPES and defs[-1].baseid:
            return defs[-1].baseid
    return None


def check_shared(items: Iterable[pytest.Item]) -> None:
    """Every module using a package-scoped fixture must be in SHARED, or two workers build its lab."""
    missing = sorted(
        {
            f"{module} (uses a fixture of {scope})"
            for item in items
            if (scope := shared_scope(item))
            and _SHARED_BY_MODULE.get(module := _module(item.nodeid)) != scope
        }
    )
    if missing:
        # not UsageError: xdist does not show a worker's usage error, only that it stopped
        raise RuntimeError(
            f"tests/workers.py: {', '.join(missing)}: add the module under its package in SHARED"
            " so that one worker runs every test sharing that fixture"
        )


class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's scope scheduling, with the suite's work units as its scopes, in the workers' order
    (longest first: `order`), not xdist's (most tests first)."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def load_times(path: Path = TIMES) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v) for k, v in data.items() if isinstance(v, int | float) and str(k).endswith(".py")
    }


def save_times(times: dict[str, float], path: Path = TIMES) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(sorted(times.items())), indent=1))
    tmp.replace(path)


def order(items: list[pytest.Item], times: dict[str, float]) -> None:
    """Put the longest units first, in place: a unit weighs the recorded seconds of its modules (a
    module without a record: its number of tests). Within a unit the order is kept (a module's
    tests may build on each other)."""
    per_module: dict[str, int] = defaultdict(int)
    for item in items:
        per_module[_module(item.nodeid)] += 1
    weight: dict[str, float] = defaultdict(float)
    for module, n in per_module.items():
        weight[unit_of(module)] += times.get(module, float(n))
    units = [unit_of(item.nodeid) for item in items]
    first_seen = {u: i for i, u in reversed(list(enumerate(units)))}
    paired = sorted(zip(units, items, strict=True), key=lambda p: (-weight[p[0]], first_seen[p[0]]))
    items[:] = [item for _, item in paired]


def measured(reports: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds per module (units are made of modules, and may be regrouped) from (node id,
    duration) of every setup, call and teardown."""
    times: dict[str, float] = defaultdict(float)
    for nodeid, seconds in reports:
        times[_module(nodeid)] += seconds
    return {m: round(s, 1) for m, s in times.items()}
