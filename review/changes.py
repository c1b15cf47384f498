"""What a change is, in git terms: its merge base, the files it touches, the stacks those feed,
its approval markers, and a copy of either side to preview.

The change is everything from the merge base of HEAD and the base branch to the working tree
(commits, staged and unstaged edits, and new files git does not ignore), which is what a pull
request would show plus what has not been committed yet.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

# Files every stack's program reads: a change to any of them touches every stack.
SHARED_INPUTS = ("Pulumi.yaml", "__main__.py", "pyproject.toml")
SHARED_INPUT_DIRS = ("components/", "autoheal/", "policy/")
# Runner files a stack ships as ConfigMaps, when its config does not name others
# (components.config.RunnerSpec's defaults).
DEFAULT_RULES_FILE = "config/rules.yaml"
DEFAULT_PLAYBOOKS_DIR = "playbooks"
# The approval marker, as a git trailer in any commit of the change:
#   Autoheal-Approve: slurm-slurmctld   (a resource's logical name, or "all")
APPROVE_TRAILER = re.compile(r"^Autoheal-Approve:\s*(\S+)", re.MULTILINE | re.IGNORECASE)
STACK_FILE = re.compile(r"^Pulumi\.([A-Za-z0-9_.-]+)\.yaml$")


class GitError(RuntimeError):
    pass


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise GitError(f"git {' '.join(args)}: {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def default_base(repo: Path) -> str:
    """origin/main when the checkout has it (CI, a clone), else main."""
    for ref in ("origin/main", "main"):
        if (
            subprocess.run(
                ["git", "rev-parse", "--verify", "--quiet", ref], cwd=repo, capture_output=True, check=False
            ).returncode
            == 0
        ):
            return ref
    raise GitError("no base branch: pass --base (neither origin/main nor main exists)")


@dataclass(frozen=True)
class Change:
    repo: Path
    base_ref: str
    merge_base: str
    files: tuple[str, ...]
    approvals: frozenset[str]

    @property
    def short_base(self) -> str:
        return self.merge_base[:12]


def describe_change(repo: Path, base_ref: str) -> Change:
    merge_base = git(repo, "merge-base", "HEAD", base_ref).strip()
    changed = git(repo, "diff", "--name-only", "--no-renames", merge_base).split()
    untracked = git(repo, "ls-files", "--others", "--exclude-standard").split()
    messages = git(repo, "log", "--format=%B", f"{merge_base}..HEAD")
    return Change(
        repo=repo,
        base_ref=base_ref,
        merge_base=merge_base,
        files=tuple(sorted(set(changed) | set(untracked))),
        approvals=frozenset(APPROVE_TRAILER.findall(messages)),
    )


def stacks_in(project: Path) -> list[str]:
    return sorted(m.group(1) for p in project.glob("Pulumi.*.yaml") if (m := STACK_FILE.match(p.name)))


def stack_inputs(project: Path, stack: str) -> list[str]:
    """The files only this stack reads: its config file and the runner files it ships."""
    doc = yaml.safe_load((project / f"Pulumi.{stack}.yaml").read_text()) or {}
    runner = (doc.get("config") or {}).get("autoheal:runner") or {}
    runner = runner if isinstance(runner, dict) else {}
    return [
        f"Pulumi.{stack}.yaml",
        str(runner.get("rulesFile", DEFAULT_RULES_FILE)),
        str(runner.get("playbooksDir", DEFAULT_PLAYBOOKS_DIR)).rstrip("/") + "/*.yml",
        str(runner.get("playbooksDir", DEFAULT_PLAYBOOKS_DIR)).rstrip("/") + "/*.yaml",
    ]


def _matches(path: str, pattern: str) -> bool:
    if pattern.endswith(("/*.yml", "/*.yaml")):
        folder, _, suffix = pattern.rpartition("/*")
        return path.startswith(folder + "/") and "/" not in path[len(folder) + 1 :] and path.endswith(suffix)
    return path == pattern


def touched_stacks(project: Path, files: Iterable[str]) -> dict[str, list[str]]:
    """Stack -> the changed files that feed it, for every stack of the project the change touches."""
    files = list(files)
    shared = [f for f in files if f in SHARED_INPUTS or f.startswith(SHARED_INPUT_DIRS)]
    out: dict[str, list[str]] = {}
    for stack in stacks_in(project):
        own = [f for f in files for pattern in stack_inputs(project, stack) if _matches(f, pattern)]
        if own or shared:
            out[stack] = sorted(set(own + shared))
    return out


def checkout(repo: Path, rev: str, into: Path) -> Path:
    """The tree of commit `rev`, written to `into` (nothing in the repository changes)."""
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "archive", "--format=tar", rev], cwd=repo, stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(into, filter="data")
    return into


def working_tree(repo: Path, into: Path, files: Sequence[str] | None = None) -> Path:
    """A copy of what the change is now: tracked and untracked files git does not ignore."""
    listed = (
        files if files is not None else git(repo, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    )
    for rel in filter(None, listed):
        src = repo / rel
        if src.is_file():
            dst = into / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return into
