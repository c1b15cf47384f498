"""The Ansible collection as a user installs it (issue 19): `ansible-galaxy collection build` makes
autoheal-cluster-<version>.tar.gz, `ansible-galaxy collection install` puts it into an empty
collections path, and the runbook runs from there (a play in check mode against a real
slurmctld) with no other copy of autoheal.cluster in reach; collections/requirements.yml names
every other collection the runbook uses, with versions the pinned `ansible` package ships."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.packaging.conftest import BIN, REPO, run

pytestmark = pytest.mark.timeout(600)

SOURCE = REPO / "collections" / "ansible_collections" / "autoheal" / "cluster"
GALAXY = yaml.safe_load((SOURCE / "galaxy.yml").read_text())
_FQCN = re.compile(r"^([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+$")
_FILTER = re.compile(r"\|\s*([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+")
_LOOKUP = re.compile(r"(?:lookup|query)\(\s*['\"]([a-z0-9_]+\.[a-z0-9_]+)\.[a-z0-9_]+")


def _env(collections: Path) -> dict[str, str]:
    """Only `collections` (and the ansible package's own, which Ansible always scans) in reach:
    no ansible.cfg (the command runs outside the checkout), the project's roles by path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_ROLES_PATH=str(REPO / "roles"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}:{env.get('PATH', '')}",
    )
    return env


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("galaxy")
    run([str(BIN / "ansible-galaxy"), "collection", "build", str(SOURCE), "--output-path", str(out)], cwd=out)
    [built] = out.glob("*.tar.gz")
    return built


def test_build_names_the_version_and_carries_every_plugin(tarball: Path) -> None:
    assert tarball.name == f"autoheal-cluster-{GALAXY['version']}.tar.gz"
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert manifest["collection_info"]["version"] == GALAXY["version"]
    tracked = subprocess.run(
        ["git", "ls-files", "plugins", "meta"], cwd=SOURCE, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked and not [p for p in tracked if p not in names], "the tarball lacks tracked files"
    assert not [n for n in names if "__pycache__" in n or n.startswith("tests/output")]


def test_installed_collection_runs_the_runbook(tarball: Path, slurm_lab: Path, tmp_path: Path) -> None:
    cols = tmp_path / "collections"
    galaxy = str(BIN / "ansible-galaxy")
    run([galaxy, "collection", "install", str(tarball), "-p", str(cols)], cwd=tmp_path, env=_env(cols))
    listed = json.loads(
        run(
            [galaxy, "collection", "list", "autoheal.cluster", "--format", "json"],
            cwd=tmp_path,
            env=_env(cols),
        )
    )
    assert listed == {str(cols / "ansible_collections"): {"autoheal.cluster": {"version": GALAXY["version"]}}}

    extra = json.dumps({"autoheal_nodes": ["gpu-2"], "autoheal_slurm_conf": str(slurm_lab)})
    play = [
        str(BIN / "ansible-playbook"),
        str(REPO / "playbooks" / "fence.yml"),
        "--check",
        "--diff",
        "-e",
        extra,
    ]
    res = subprocess.run(play, cwd=tmp_path, env=_env(cols), capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert re.search(r"localhost\s*:\s*ok=\d+\s+changed=1\s+unreachable=0\s+failed=0", out), out
    state = subprocess.run(
        ["sinfo", "-h", "-N", "-n", "gpu-2", "-o", "%T"],
        env={"SLURM_CONF": str(slurm_lab), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "drain" not in state, state
    # the same play with an empty collections path fails: the installed copy is what ran
    empty = tmp_path / "empty"
    empty.mkdir()
    res = subprocess.run(play, cwd=tmp_path, env=_env(empty), capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "autoheal.cluster" in res.stdout + res.stderr


def _used_collections(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and (m := _FQCN.match(key)):
                found.add(m.group(1))
            if key == "name" and isinstance(value, str) and (m := _FQCN.match(value)):
                found.add(m.group(1))  # include_role: name: ns.coll.role
            _used_collections(value, found)
    elif isinstance(node, list):
        for item in node:
            _used_collections(item, found)
    elif isinstance(node, str):
        found.update(_FILTER.findall(node))
        found.update(_LOOKUP.findall(node))


def test_requirements_name_what_the_runbook_uses_at_versions_ansible_ships() -> None:
    used: set[str] = set()
    for path in [*REPO.glob("playbooks/*.yml"), *REPO.glob("roles/**/*.yml")]:
        _used_collections(yaml.safe_load(path.read_text()), used)
    used -= {"ansible.builtin", "autoheal.cluster"}
    assert "kubernetes.core" in used, used  # the scan works: the audit role's k8s module
    required = {
        c["name"]: c["version"]
        for c in yaml.safe_load((REPO / "collections/requirements.yml").read_text())["collections"]
    }
    assert used <= set(required), (
        f"used but not in collections/requirements.yml: {sorted(used - set(required))}"
    )
    shipped = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "list", "--format", "json"],
        env=_env(Path("/nonexistent")),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    versions = {name: info["version"] for cols in json.loads(shipped).values() for name, info in cols.items()}
    for name, spec in required.items():
        assert name in versions, f"{name}: not in the installed ansible package ({sys.executable})"
        assert Version(versions[name]) in SpecifierSet(spec), f"{name} {versions[name]} outside {spec}"
