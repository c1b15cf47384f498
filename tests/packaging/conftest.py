"""Fixtures for the packaging tests (issue 19): the wheel and sdist built as a user builds them,
the wheel installed into a fresh virtualenv outside the checkout, and one small lab (real Slurm,
no Kubernetes) for plays in check mode.

The fresh venv gets autoheal from the wheel (`pip install --no-deps`) and its dependencies from
this venv's site-packages through a .pth line: a full install from the index would download
~600 MB (ansible, kubernetes) for every run. A .pth entry's own .pth files are not processed, so
this venv's editable autoheal (a finder hook pointing at the checkout) stays out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoheal import __version__
from tests.support import port_base

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VERSION: str = __version__
LAB_NAME = "f-packaging"
LAB_PORTS = port_base(26000)


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    seconds: float


@dataclass(frozen=True)
class Installed:
    venv: Path
    share: Path

    @property
    def autoheal(self) -> str:
        return str(self.venv / "bin" / "autoheal")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def env(self) -> dict[str, str]:
        """The environment of a user of the installed package: its venv's bin first (this venv's
        after it, for ansible-playbook, which the .pth'd dependencies do not bring), no
        PYTHONPATH, no data root override."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOHEAL_DATA_ROOT")}
        env["PATH"] = f"{self.venv / 'bin'}:{BIN}:{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.venv)
        return env


def run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"{argv} -> rc={res.returncode}\n{res.stdout}\n{res.stderr}")
    return res.stdout


@pytest.fixture(scope="package")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`python -m build`: the sdist first, then the wheel built from the sdist (so a file the sdist
    forgets is missing from the wheel too)."""
    out = tmp_path_factory.mktemp("dist")
    t0 = time.monotonic()
    run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], cwd=REPO, timeout=600)
    seconds = time.monotonic() - t0
    [wheel] = out.glob("autoheal-*.whl")
    [sdist] = out.glob("autoheal-*.tar.gz")
    return Dist(wheel, sdist, seconds)


@pytest.fixture(scope="package")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    venv = tmp_path_factory.mktemp("user") / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    py = venv / "bin" / "python"
    site = Path(
        run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=venv.parent
        ).strip()
    )
    (site / "zz-autoheal-test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--quiet",
            "--no-deps",
            str(dist.wheel),
        ],
        cwd=venv.parent,
    )
    return Installed(venv, venv / "share" / "autoheal")


@pytest.fixture(scope="package")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small lab (2 nodes + 1 spare, no Kubernetes, no runner): the slurm.conf of a real
    slurmctld for plays in check mode. Always torn down."""
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    root = tmp_path_factory.mktemp("flab")
    base = [str(BIN / "autoheal"), "lab"]
    where = ["--name", LAB_NAME, "--root", str(root)]
    up = [*base, "up", *where, "--port-base", str(LAB_PORTS), "--nodes", "2", "--spares", "1"]
    up += ["--headroom", "1", "--no-kube", "--no-runner", "--no-watchers"]
    try:
        run(up, cwd=REPO, timeout=300)
        yield root / LAB_NAME / "slurm" / "slurm.conf"
    finally:
        subprocess.run([*base, "down", *where], cwd=REPO, capture_output=True, timeout=300, check=False)
