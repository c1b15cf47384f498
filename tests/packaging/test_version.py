"""One version everywhere (issue 19): autoheal/__init__.py's __version__ is the package's (the
built wheel's metadata), the collection's (galaxy.yml and its changelog), the default tag of the
runner image the Pulumi components deploy, what `autoheal --version` prints, and a CHANGELOG.md
entry."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from autoheal import __version__
from components.runner import RemediationRunnerArgs
from components.xid_watcher import DEFAULT_WATCHER_IMAGE
from remediation.journal import Journal
from tests.packaging.conftest import REPO, Dist

COLLECTION = REPO / "collections/ansible_collections/autoheal/cluster"


def test_version_is_a_release_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__


def test_collection_has_the_same_version_and_a_changelog_entry() -> None:
    assert yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"] == __version__
    releases = yaml.safe_load((COLLECTION / "changelogs/changelog.yaml").read_text())["releases"]
    assert __version__ in releases


def test_changelog_has_an_entry_for_the_version() -> None:
    headings = re.findall(r"^## (\d+\.\d+\.\d+)\b", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert headings and headings[0] == __version__, f"CHANGELOG.md's newest entry is {headings[:1]}"


def test_images_default_to_the_version() -> None:
    runner_image = RemediationRunnerArgs.__dataclass_fields__["image"].default
    assert runner_image == f"ghcr.io/autoheal/runner:{__version__}"
    assert runner_image == DEFAULT_WATCHER_IMAGE


def test_cli_prints_the_version(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "autoheal"), "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"autoheal {__version__}"


def test_wheel_metadata_has_the_version(dist: Dist) -> None:
    assert dist.wheel.name.startswith(f"autoheal-{__version__}-")
    with zipfile.ZipFile(dist.wheel) as whl:
        meta = whl.read(f"autoheal-{__version__}.dist-info/METADATA").decode()
    assert f"\nVersion: {__version__}\n" in meta


def test_every_run_records_the_version(tmp_path: Path) -> None:
    """The journal keeps, for every run, the release that started it (schema v3)."""
    journal = Journal(tmp_path / "journal.sqlite")
    with journal.transaction() as tx:
        run_id = tx.create_run(
            playbook="fence.yml", incident_ids=[], nodes=["gpu-1"], check_mode=True, source="manual"
        )
    [run] = [r for r in journal.runs() if r.id == run_id]
    assert run.autoheal_version == __version__
    journal.close()
