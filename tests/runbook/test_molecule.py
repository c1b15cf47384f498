"""The molecule scenario (extensions/molecule/default) as part of `make test`: the on-call plays
(fence, requeue, unfence, node_return) against a lab of its own, with idempotence; and proof that
a broken role fails it. molecule finds ansible-config and ansible-playbook on PATH, so the
virtualenv's bin/ goes first there (the virtualenv need not be activated)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.runbook.conftest import AUTOHEAL, REPO, VENV_BIN

pytestmark = pytest.mark.lab

LAB = "molecule"  # the scenario's lab name (molecule.yml)


def molecule_test(project: Path, lab_root: Path) -> subprocess.CompletedProcess[str]:
    """`molecule test` from `project`/extensions; the scenario's lab lives in `lab_root` and is
    stopped whatever happens."""
    env = dict(os.environ)
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}",
        AUTOHEAL_MOLECULE_LAB_ROOT=str(lab_root),
        # molecule's state and inventory, else under ~/.ansible/tmp for good (one per scenario run)
        MOLECULE_EPHEMERAL_DIRECTORY=str(lab_root / "molecule-ephemeral"),
        ANSIBLE_NOCOLOR="1",
        PY_COLORS="0",
    )
    env.pop("SLURM_CONF", None)
    try:
        return subprocess.run(
            [str(VENV_BIN / "molecule"), "test", "-s", "default"],
            cwd=project / "extensions",
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
    finally:
        subprocess.run(
            [AUTOHEAL, "lab", "down", "--name", LAB, "--root", str(lab_root)],
            capture_output=True,
            timeout=120,
            check=False,
        )


def test_the_on_call_plays_converge_idempotently_on_a_real_lab(tmp_path):
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    res = molecule_test(REPO, tmp_path / "labs")
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-6000:]
    for action in ("destroy", "syntax", "prepare", "converge", "idempotence", "verify", "cleanup"):
        assert f"default > {action}: Executed: Successful" in out, (action, out[-3000:])


def test_a_role_that_changes_on_every_run_fails_the_scenario(tmp_path):
    """A copy of the project whose slurm_node role reports a change every time: molecule's
    idempotence action must fail it."""
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed")
    project = tmp_path / "project"
    for part in ("extensions", "roles", "playbooks", "collections"):
        shutil.copytree(
            REPO / part, project / part, ignore=shutil.ignore_patterns("__pycache__", "output", ".molecule")
        )
    shutil.copy(REPO / "ansible.cfg", project / "ansible.cfg")
    tasks = project / "roles/slurm_node/tasks/main.yml"
    broken = tasks.read_text().replace(
        "  register: slurm_node_result", "  register: slurm_node_result\n  changed_when: true"
    )
    assert broken != tasks.read_text()
    tasks.write_text(broken)
    res = molecule_test(project, tmp_path / "labs")
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "Idempotence test failed" in out, out[-3000:]
