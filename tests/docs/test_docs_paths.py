"""The docs name only what exists: every repository path, shipped file name and Python module that
README.md and docs/*.md name in backticks is still there. A rename or a removal that leaves the
docs pointing at nothing fails here, naming the document, the line and the stale name."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PACKAGES = ("autoheal", "remediation", "components", "lab", "watcher", "images", "policy", "review", "bench")
SHIPPED = (".py", ".yml", ".yaml", ".sh", ".toml", ".md", ".j2", ".json")
SKIP_DIRS = {".git", ".venv", ".lab", ".stamps", "node_modules", "__pycache__", "dist", "build"}
TOKEN = re.compile(r"`([^`\s]+)`")
MODULE = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.[a-z_][a-z0-9_]*)+$")
TOP = {p.name for p in REPO.iterdir()}


def _repo_files() -> set[str]:
    names: set[str] = set()
    stack = [REPO]
    while stack:
        d = stack.pop()
        for p in d.iterdir():
            if p.is_dir():
                if p.name not in SKIP_DIRS:
                    stack.append(p)
            else:
                names.add(p.name)
    return names


def _names() -> list[tuple[str, int, str]]:
    """(document, line, name) for each backticked token that names a path, file or module."""
    found = []
    for doc in DOCS:
        for no, line in enumerate(doc.read_text().splitlines(), 1):
            for tok in TOKEN.findall(line):
                tok = tok.rstrip(".,:;)")
                if any(c in tok for c in "<>$*{}=") or tok.startswith(("/", "~", "-", "http")):
                    continue  # a placeholder, a pattern, an option or a host path
                found.append((doc.name, no, tok))
    return found


COLLECTION = REPO / "collections/ansible_collections/autoheal/cluster"
# files the project writes at run time, not in the repository
GENERATED = {"images.lock.json", "pool.json"}
# spelt like a module, and something else: a routing rule's setting (config/rules.yaml)
NOT_MODULES = {"autoheal.dry_run"}


def _in_collection(tok: str) -> bool | None:
    """autoheal.cluster.NAME: a module, action, filter or role of the collection."""
    name = tok.removeprefix("autoheal.cluster").lstrip(".")
    if not name:
        return COLLECTION.is_dir()
    if "." in name:
        return None  # e.g. an option path: not a name of its own
    plugins = {p.stem for p in (COLLECTION / "plugins").glob("*/*") if p.suffix in (".py", ".yml")}
    return name in plugins or (REPO / "roles" / name).is_dir()


def _exists(tok: str, files: set[str]) -> bool | None:
    """True/False for a path, a shipped file name, a module of the project or a name of the
    collection; None for anything else (a label, a command, a value)."""
    tok = tok.split("#", 1)[0]
    if tok.startswith("autoheal.cluster"):
        return _in_collection(tok)
    if tok in GENERATED:
        return None
    if "/" in tok:
        first = tok.split("/", 1)[0]
        if first not in TOP:
            return None  # e.g. nvidia.com/gpu, apps/v1
        return (REPO / tok.split(":", 1)[0]).exists()
    if MODULE.match(tok) and tok not in NOT_MODULES:
        parts = tok.split(".")
        for cut in range(len(parts), 1, -1):  # a module, or an attribute of one (remediation.cli:register)
            try:
                if importlib.util.find_spec(".".join(parts[:cut])) is not None:
                    return True
            except ModuleNotFoundError:
                continue
        return False
    if tok.endswith(SHIPPED) and re.fullmatch(r"[\w.-]+", tok) and "." in tok[1:]:
        return tok in files
    return None


def test_every_documented_path_file_and_module_exists() -> None:
    files = _repo_files()
    checked, stale = 0, []
    for doc, no, tok in _names():
        ok = _exists(tok, files)
        if ok is None:
            continue
        checked += 1
        if not ok:
            stale.append(f"{doc}:{no}: `{tok}`")
    assert checked > 50, f"only {checked} names checked: the scan lost its way"
    assert not stale, "the docs name what no longer exists:\n" + "\n".join(stale)


@pytest.mark.parametrize(
    ("tok", "want"),
    [
        ("remediation/worker.py", True),
        ("remediation/nothing_here.py", False),
        ("remediation.worker", True),
        ("remediation.nothing_here", False),
        ("fence.yml", True),
        ("nvidia.com/gpu", None),
        ("autoheal.io/pool", None),
        ("autoheal.cluster.fence", True),
        ("autoheal.cluster.no_such_module", False),
        ("docs/architecture.md#incident-states", True),
    ],
)
def test_the_scan_tells_a_stale_name_from_a_live_one(tok: str, want: bool | None) -> None:
    assert _exists(tok, _repo_files()) is want
