"""The wheel's data files: the runbook and everything the CLI, the runner and the lab read as files.

pyproject.toml holds the project's metadata; this file only lists the data files, because
setuptools' `data-files` table flattens directories and these are trees (roles/<role>/tasks/...).
They install under <prefix>/share/autoheal, where autoheal.paths.data_root() finds them when the
package runs from an installed wheel rather than a checkout (docs/operations.md, "Installing").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
SHARE = "share/autoheal"
# keep in step with MANIFEST.in (the sdist); images/python.py data_items() reads this (the runner image)
DATA = (
    "ansible.cfg",
    "Pulumi.yaml",
    "Pulumi.lab.yaml",
    "Pulumi.example-eks.yaml",
    "__main__.py",
    "playbooks",
    "roles",
    "collections",
    "config",
    "inventory",
    "examples",
    "monitoring",
)
# caches and test output, never part of a release (ansible-test writes tests/output)
SKIP_DIRS = {"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "output"}


def _files(item: Path) -> Iterator[Path]:
    if item.is_file():
        yield item
        return
    for path in sorted(item.rglob("*")):
        rel = path.relative_to(ROOT)
        if path.is_file() and not SKIP_DIRS & set(rel.parts) and path.suffix != ".pyc":
            yield path


def data_files() -> list[tuple[str, list[str]]]:
    """(install dir, [source files]) per directory, relative to the project root as setuptools wants."""
    by_dir: dict[str, list[str]] = {}
    for name in DATA:
        if not (ROOT / name).exists():
            raise SystemExit(f"setup.py: {name} is missing from {ROOT}; a release carries it")
        for path in _files(ROOT / name):
            rel = path.relative_to(ROOT)
            by_dir.setdefault(str(Path(SHARE, *rel.parts[:-1])), []).append(str(rel))
    return sorted(by_dir.items())


setup(data_files=data_files())
