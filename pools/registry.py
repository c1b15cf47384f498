"""Pool backends by name: `--backend aws` -> pools.aws.

A backend is a factory taking BackendOptions and returning a pools.base.PoolBackend. The backends
of this package are listed in BUILTIN; a layer above it (the lab's `lab` backend) adds its own
through the `autoheal.pools` entry-point group (pyproject.toml), so nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import import_module
from importlib.metadata import entry_points
from typing import Final

from autoheal.errors import ConfigError
from pools.base import PoolBackend

ENTRY_POINT_GROUP: Final = "autoheal.pools"

# name -> "module:factory" of the backends in this package
BUILTIN: Final[dict[str, str]] = {
    "aws": "pools.aws:from_options",
    "karpenter": "pools.karpenter:from_options",
}


@dataclass(frozen=True)
class BackendOptions:
    """What `autoheal pool` passes to a backend's factory."""

    kubeconfig: str = ""
    # the cloud cluster whose machines the backend may act on (AWS: the EKS cluster's name)
    cluster: str = ""
    # backend-specific settings (`--option KEY=VALUE`), e.g. the lab's name
    options: dict[str, str] = field(default_factory=dict)


Factory = Callable[[BackendOptions], PoolBackend]


def _load(ref: str) -> Factory:
    module, _, attr = ref.partition(":")
    factory: Factory = getattr(import_module(module), attr)
    return factory


def names() -> list[str]:
    """Every backend name this installation knows."""
    return sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def factory(name: str) -> Factory:
    """The factory of backend `name`, or ConfigError naming the known ones."""
    if name in BUILTIN:
        return _load(BUILTIN[name])
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        loaded: Factory = ep.load()
        return loaded
    raise ConfigError(f"--backend {name!r}: unknown pool backend; known: {', '.join(names())}")


def backend(name: str, opts: BackendOptions) -> PoolBackend:
    """A backend by name, built from the options."""
    return factory(name)(opts)
