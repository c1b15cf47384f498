"""Fixtures for the runner's tests: a config in a tmp dir, a built runtime, the stub's effects, and
the journal on each of its engines (SQLite, and PostgreSQL on a private server for this folder's tests)."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from autoheal.errors import LabError
from lab.postgres import PostgresServer, server_bin, throwaway_server
from remediation.app import Runtime
from remediation.config import RunnerConfig
from remediation.journal import Journal
from remediation.kubeview import FakeKube
from remediation.runtime import build
from tests.remediation.remhelp import make_config
from tests.support import port_base

PG_PORT = port_base(24700)  # +0: the folder's server; +1: a test's own server (restarted, stopped)
_PG_DATABASES = itertools.count(1)


@pytest.fixture
def kube() -> FakeKube:
    return FakeKube({f"gpu-{i}": {"autoheal.io/pool": "h100"} for i in range(1, 21)})


@pytest.fixture
def config_factory(tmp_path: Path) -> Callable[..., RunnerConfig]:
    def factory(**overrides: Any) -> RunnerConfig:
        return make_config(tmp_path, **overrides)

    return factory


@pytest.fixture
def runtime_factory(
    kube: FakeKube, config_factory: Callable[..., RunnerConfig]
) -> Iterator[Callable[..., Runtime]]:
    built: list[Runtime] = []

    def factory(with_worker: bool = True, **overrides: Any) -> Runtime:
        rt = build(config_factory(**overrides), kube=kube, with_worker=with_worker)
        built.append(rt)
        return rt

    yield factory
    for rt in built:
        if rt.worker is not None:
            rt.worker.stop()
        rt.journal.close()


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stub plays' side-effect log ("phase node" per line)."""
    path = tmp_path / "effects.log"
    monkeypatch.setenv("AUTOHEAL_STUB_EFFECTS", str(path))
    return path


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:Using `httpx` with `starlette.testclient`:UserWarning")


def _throwaway_pg(port: int) -> Iterator[PostgresServer]:
    try:
        server_bin()
    except LabError as exc:
        pytest.skip(f"POSTGRESQL JOURNAL NOT TESTED: {exc}")
    with throwaway_server(port) as server:
        yield server


@pytest.fixture(scope="package")
def pg_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server for this folder's tests (initdb and start: about a second)."""
    yield from _throwaway_pg(PG_PORT)


@pytest.fixture
def own_pg() -> Iterator[PostgresServer]:
    """A server of the test's own, to stop and restart (the folder's serves the other tests)."""
    yield from _throwaway_pg(PG_PORT + 1)


@pytest.fixture
def pg_dsn(pg_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the folder's server, dropped after the test."""
    name = f"t_{next(_PG_DATABASES)}"
    pg_server.create_database(name)
    yield pg_server.dsn(name)
    pg_server.drop_database(name)


@dataclass
class JournalTarget:
    """Where a test's journal lives, on one engine: open() gives a handle on it (again and again)."""

    kind: str
    path: Path | None = None  # sqlite
    dsn: str | None = None  # postgres
    opened: list[Journal] = field(default_factory=list)

    def open(self, **kwargs: Any) -> Journal:
        if self.dsn is not None:
            journal = Journal.postgres(self.dsn, **kwargs)
        else:
            assert self.path is not None
            journal = Journal(self.path, **kwargs)
        self.opened.append(journal)
        return journal

    def write_schema_version(self, version: int) -> None:
        """Record `version` behind the journal's back (as a newer runner would have)."""
        if self.dsn is not None:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute("UPDATE schema_version SET version = %s", (version,))
        else:
            con = sqlite3.connect(str(self.path))
            con.execute(f"PRAGMA user_version={int(version)}")
            con.close()


@pytest.fixture(params=["sqlite", "postgres"])
def journal_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[JournalTarget]:
    """The journal-level tests run on both engines: the same tests, the same expectations."""
    if request.param == "sqlite":
        target = JournalTarget("sqlite", path=tmp_path / "j.sqlite")
    else:
        target = JournalTarget("postgres", dsn=request.getfixturevalue("pg_dsn"))
    yield target
    for journal in target.opened:
        journal.close()
