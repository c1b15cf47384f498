"""One temporary folder per test run, removed when the run ends.

A run's processes leave files in the system's temp dir that nothing removes: pytest's own folders,
the labs' socket folders, Ansible's module payloads and local temp folders of a killed play, the
Pulumi Kubernetes provider's kubeconfig copies, the Kubernetes client's certificate files, the
spares' lock files. The run points TMPDIR (and Ansible's local temp) at a folder of its own before
anything starts; the workers and every process the tests start inherit it, so one removal at the
end takes all of it. A run killed before its end leaves the folder behind: lab.disk names it as a
leftover once its owner is gone.

What must be shared beyond one run stays outside it: the lab's network-block lock is machine-wide
(lab.nodes.net).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from lab import disk

KEEP_ENV = "AUTOHEAL_KEEP_TMP"  # "1": leave the run's folder for a post-mortem


def enter() -> Path | None:
    """Create the run's folder and point this process's temp dir (and its children's) at it.
    None where a run's folder is already in force: an xdist worker, or a pytest started by a test."""
    if os.environ.get(disk.SCRATCH_ENV):
        return None
    path = Path(tempfile.mkdtemp(prefix=disk.SCRATCH_PREFIX))
    path.chmod(0o1777)  # as /tmp: the lab's services running as their own users (postgres) write here
    (path / disk.SCRATCH_OWNER).write_text(disk.scratch_owner())
    os.environ[disk.SCRATCH_ENV] = str(path)
    os.environ["TMPDIR"] = str(path)
    os.environ["ANSIBLE_LOCAL_TEMP"] = str(path / "ansible")
    # every play here connects locally: its module payloads too (a killed play leaves them behind)
    os.environ["ANSIBLE_REMOTE_TEMP"] = str(path / "ansible-remote")
    tempfile.tempdir = None  # gettempdir() caches its answer: make it read TMPDIR again
    return path


def leave(path: Path) -> str | None:
    """Remove the run's folder, unless KEEP_ENV says keep it; a line for the operator when the
    folder is still there afterwards."""
    if os.environ.get(KEEP_ENV) == "1":
        return f"the run's temporary folder is kept ({KEEP_ENV}=1): {path}"
    shutil.rmtree(path, ignore_errors=True)
    return f"the run's temporary folder could not all be removed: {path}" if path.exists() else None
