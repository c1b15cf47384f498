"""Where autoheal's shipped files live, so no module has to guess from its own location.

The runbook (playbooks, roles, the Ansible collection), the routing rules, the example job and
the Pulumi project are files, not Python modules. In a checkout they sit beside the packages; an
installed wheel carries them under ``<prefix>/share/autoheal``. Code asks `data_root()` instead
of walking up from ``__file__``, which only ever worked from a checkout.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path

from autoheal.errors import ConfigError

ENV_VAR = "AUTOHEAL_DATA_ROOT"
# A directory is a data root when it holds these (the runbook is what everything else needs).
_MARKERS = ("playbooks", "roles")


def _is_root(path: Path) -> bool:
    return all((path / m).is_dir() for m in _MARKERS)


def candidates() -> list[Path]:
    """The places searched, in order: $AUTOHEAL_DATA_ROOT, the checkout, the installed share."""
    found: list[Path] = []
    if env := os.environ.get(ENV_VAR):
        found.append(Path(env).expanduser().resolve())
    found.append(Path(__file__).resolve().parent.parent)
    found.append(Path(sys.prefix) / "share" / "autoheal")
    return found


@cache
def data_root() -> Path:
    """The directory holding playbooks/, roles/, collections/, config/, examples/."""
    env = os.environ.get(ENV_VAR)
    if env and not _is_root(Path(env).expanduser()):
        raise ConfigError(
            f"{ENV_VAR}={env}: not an autoheal data root (it needs {' and '.join(_MARKERS)}/); "
            "point it at a checkout or at <prefix>/share/autoheal"
        )
    for path in candidates():
        if _is_root(path):
            return path
    raise ConfigError(
        "cannot find autoheal's playbooks and roles: looked in "
        + ", ".join(str(p) for p in candidates())
        + f"; set {ENV_VAR} to a checkout or to <prefix>/share/autoheal"
    )
