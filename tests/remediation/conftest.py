"""Fixtures for the runner's tests: a config in a tmp dir, a built runtime, the stub's effects."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from remhelp import make_config

from remediation.app import Runtime
from remediation.config import RunnerConfig
from remediation.kube import FakeKube
from remediation.runtime import build


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
