"""The image lock file `autoheal images build` writes (autoheal/imagelock.py, images/cli.py): the
references by digest it produced, pushed ones where it pushed, written atomically where the stack
reads them. The build itself is faked (tests/nodes/test_images.py builds real images)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import images.cli as images_cli
import images.push
from autoheal.errors import ConfigError
from autoheal.imagelock import LOCK_FILE, pinned_by_digest, read_lock, write_lock
from images import build as images_build
from images.build import BuiltImage

DIGEST = {n: f"sha256:{c * 64}" for n, c in (("pause", "1"), ("slurm", "2"), ("runner", "3"))}


def _built(name: str) -> BuiltImage:
    return BuiltImage(
        name=name,
        key="k" * 16,
        repository=f"localhost/autoheal/{name}",
        tag="0.3.0-kkkkkkkkkkkk",
        digest=DIGEST[name],
        layout=f"/cache/{name}",
        size=1,
        build_seconds=0.0,
        cached=True,
    )


IMGS = [_built(n) for n in ("pause", "slurm", "runner")]


def test_the_builder_records_its_references_by_digest(tmp_path: Path) -> None:
    lock = tmp_path / "proj" / LOCK_FILE
    assert images_cli.record_lock(lock, IMGS, {}) == {i.name: i.ref for i in IMGS}
    doc = json.loads(lock.read_text())
    assert doc == {
        "version": 1,
        "images": {
            "pause": f"localhost/autoheal/pause@{DIGEST['pause']}",
            "runner": f"localhost/autoheal/runner@{DIGEST['runner']}",
            "slurm": f"localhost/autoheal/slurm@{DIGEST['slurm']}",
        },
    }
    assert read_lock(lock) == doc["images"]
    assert [p.name for p in lock.parent.iterdir()] == [LOCK_FILE]  # no temporary file left behind


def test_pushed_references_replace_the_local_ones_and_other_images_are_kept(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_FILE
    images_cli.record_lock(lock, IMGS, {})
    pushed = {"runner": f"reg.example.com/team/autoheal-runner@{DIGEST['runner']}"}
    got = images_cli.record_lock(lock, [IMGS[2]], pushed)  # `--image runner --push ...`
    assert got["runner"] == pushed["runner"]
    assert got["slurm"] == IMGS[1].ref and got["pause"] == IMGS[0].ref  # not forgotten
    assert read_lock(lock) == got


def test_a_lock_that_cannot_be_read_is_replaced_by_its_writer(tmp_path: Path) -> None:
    lock = tmp_path / LOCK_FILE
    lock.write_text("{half a fi")
    assert images_cli.record_lock(lock, [IMGS[1]], {}) == {"slurm": IMGS[1].ref}


def test_the_writer_never_records_a_tag(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not references by digest"):
        write_lock(tmp_path / LOCK_FILE, {"slurm": "localhost/autoheal/slurm:1"})
    assert not (tmp_path / LOCK_FILE).exists()


def test_an_unwritable_lock_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"file/images\.lock\.json: cannot write .*--lock PATH"):
        write_lock(blocker / LOCK_FILE, {"slurm": IMGS[1].ref})


@pytest.mark.parametrize(
    "ref",
    [
        "localhost/autoheal/slurm:24.11",
        "x@sha256:" + "A" * 64,
        "x@sha256:" + "a" * 63,
        "x@sha512:" + "a" * 64,
        "@sha256:" + "a" * 64,
    ],
)
def test_only_sha256_digests_count_as_pinned(ref: str) -> None:
    assert not pinned_by_digest(ref)
    assert pinned_by_digest("reg.io:5000/a/b:tag@sha256:" + "0a" * 32)


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> list[list[str] | None]:
    """`autoheal images build` without building: the cache's answer, and the names it was asked."""
    asked: list[list[str] | None] = []

    def build(names: list[str] | None, progress: object, rebuild: bool = False) -> list[BuiltImage]:
        asked.append(names)
        return [i for i in IMGS if not names or i.name in names]

    monkeypatch.setattr(images_build, "build", build)  # the command imports it when it runs
    return asked


def test_the_build_command_writes_the_lock_in_the_project_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_build: list[list[str] | None]
) -> None:
    monkeypatch.setattr(images_cli, "data_root", lambda: tmp_path)
    res = CliRunner().invoke(images_cli.images_app, ["build", "--json"])
    assert res.exit_code == 0, res.output
    assert read_lock(tmp_path / LOCK_FILE) == {i.name: i.ref for i in IMGS}


def test_the_build_command_records_pushed_references_in_the_lock_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_build: list[list[str] | None]
) -> None:
    def push(img: BuiltImage, registry: str, tls_verify: bool = True) -> str:
        return f"{registry}/autoheal-{img.name}@{img.digest}"

    monkeypatch.setattr(images.push, "push", push)
    monkeypatch.setattr(images_cli, "data_root", lambda: pytest.fail("--lock names the file"))
    lock = tmp_path / "ci" / "lock.json"
    res = CliRunner().invoke(
        images_cli.images_app, ["build", "--image", "slurm", "--push", "reg.io/t", "--lock", str(lock)]
    )
    assert res.exit_code == 0, res.output
    assert fake_build == [["slurm"]]
    assert read_lock(lock) == {"slurm": f"reg.io/t/autoheal-slurm@{DIGEST['slurm']}"}


def test_build_help_names_the_lock_option_and_its_default() -> None:
    """(Rich renders the help: "[/path]" in --push's text once made it fail with a MarkupError.)"""
    res = CliRunner().invoke(images_cli.images_app, ["build", "--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.replace("│", " ").split())  # the help box, unwrapped
    assert "--lock" in text and LOCK_FILE in text and "in the Pulumi project folder" in text
    assert "host[:port][/path]" in text
