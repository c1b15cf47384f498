"""Free disk before anything starts: a lab, or the test suite, refuses to begin where it would fill
the disk, and says what to clean.

A full disk fails late and far from its cause: the real nodes' kubelets evict every pod below
their floor and taint themselves disk-pressure, so pods sit Pending or in ImagePullBackOff until a
wait times out (a whole CI run was lost that way). What a run leaves behind that is safe to remove
is named here, largest first: stopped labs' folders (each real node's image store is ~760 MB),
pytest's temporary folders of earlier runs, and the temporary folders of test runs that were
killed before their end (tests/scratch.py).
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from autoheal import proc as kernel
from autoheal.errors import LabError
from lab import procs

GIB = 1 << 30
# What one lab needs beside its real nodes: logs, Slurm and Prometheus state, the journal (a
# 2,000-node storm lab wrote ~300 MB, measured 2026-12-02)
LAB_BASE_BYTES = 1 * GIB
# One real node: its image store (~760 MB for the three images) and its pod logs
REAL_NODE_BYTES = 1 * GIB
# The test suite at its peak: a real-node lab (3 nodes) and a pods lab beside the images it
# builds and pytest's folders of the failed tests it keeps
SUITE_BYTES = 8 * GIB

# A test run's own temporary folder (tests/scratch.py): its path while the run lasts, the prefix of
# its name under the system's temp dir, and the file in it holding its owner's PID
SCRATCH_ENV = "AUTOHEAL_TEST_SCRATCH"
SCRATCH_PREFIX = "ahrun-"  # short: the labs' UNIX socket paths under it must fit 108 bytes
SCRATCH_OWNER = "owner.pid"


@dataclass(frozen=True)
class Leftover:
    path: Path
    size: int  # bytes

    def __str__(self) -> str:
        return f"{self.path} ({self.size / GIB:.1f} GiB)"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (or its first
    existing parent)."""
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def tree_size(path: Path) -> int:
    """Bytes of the regular files under `path`, not following links (a lab's folders hold links
    into the host and bind mounts that are gone once the lab is down)."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def system_temp() -> Path:
    """The system's temp dir, also inside a test run (which points TMPDIR at its own folder)."""
    scratch = os.environ.get(SCRATCH_ENV)
    return Path(scratch).parent if scratch else Path(tempfile.gettempdir())


def pytest_roots() -> list[Path]:
    """pytest's temporary roots of this user (it keeps earlier runs' folders there)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        return []
    return [system_temp() / f"pytest-of-{user}"]


def scratch_owner() -> str:
    """What a run writes into SCRATCH_OWNER: its PID and the PID's start time (a PID is reused)."""
    return f"{os.getpid()} {kernel.start_ticks(os.getpid()) or 0}\n"


def scratch_owner_alive(folder: Path) -> bool:
    try:
        pid, ticks = (int(x) for x in (folder / SCRATCH_OWNER).read_text().split())
    except (OSError, ValueError):
        return False
    return kernel.is_same(pid, ticks)


def stale_scratch() -> list[Path]:
    """Test runs' temporary folders whose run is over (killed before it could remove its own)."""
    return [d for d in system_temp().glob(f"{SCRATCH_PREFIX}*") if d.is_dir() and not scratch_owner_alive(d)]


def leftovers(lab_roots: Iterable[Path], keep: Iterable[Path] = ()) -> list[Leftover]:
    """Stopped labs under `lab_roots` and pytest's earlier run folders, largest first; `keep`
    (e.g. the run now starting) is left out. A lab with a live PID file is not a leftover."""
    kept = {Path(p).resolve() for p in keep}
    found: list[Leftover] = []
    candidates: list[Path] = []
    for root in lab_roots:
        root = Path(root)
        if root.is_dir():
            candidates += [d for d in root.iterdir() if d.is_dir() and not _running(d)]
    for root in pytest_roots():
        if root.is_dir():
            candidates += [d for d in root.iterdir() if d.is_dir() and d.name.startswith("pytest-")]
    candidates += stale_scratch()
    for d in candidates:
        if d.resolve() in kept or any(k.is_relative_to(d.resolve()) for k in kept):
            continue
        size = tree_size(d)
        if size >= 1 << 20:
            found.append(Leftover(d, size))
    return sorted(found, key=lambda x: x.size, reverse=True)


def _running(lab_dir: Path) -> bool:
    """A lab folder with a live process (lab.procs' PID files) is in use."""
    return bool(procs.running(lab_dir))


def require_free(path: Path, need: int, what: str, lab_roots: Iterable[Path] = ()) -> None:
    """Raise LabError naming the disk, the free space, the need and what to clean, when less than
    `need` bytes are free under `path`."""
    free = free_bytes(path)
    if free >= need:
        return
    items = leftovers(lab_roots, keep=[path])
    clean = "; ".join(str(x) for x in items[:8]) or "nothing of autoheal's found: free space elsewhere"
    raise LabError(
        f"{what} needs ~{need / GIB:.1f} GiB free under {path}, and the disk has {free / GIB:.1f} GiB. "
        f"Stop running labs (`autoheal lab down --name NAME`), then remove what earlier runs left "
        f"(largest first): {clean}"
    )


def lab_need(real_nodes: int) -> int:
    """Bytes a lab with `real_nodes` real nodes needs free before it starts."""
    return LAB_BASE_BYTES + real_nodes * REAL_NODE_BYTES
