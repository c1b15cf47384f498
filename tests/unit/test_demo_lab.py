"""lab.demo.demo_lab: every demo's frame (the XID, burst and link-flap demos) brings the lab down
after the story, also when the story fails, and leaves it up with --keep."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from autoheal.errors import LabError
from lab import demo
from lab import lab as labmod
from lab.config import LabConfig


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def up(cfg: LabConfig, say: object) -> LabConfig:
        seen.append("up")
        return cfg

    monkeypatch.setattr(labmod, "up", up)
    monkeypatch.setattr(labmod, "down", lambda cfg: seen.append("down"))
    monkeypatch.setattr(demo, "check_healthy", lambda cfg: seen.append("healthy"))
    return seen


@pytest.mark.parametrize("keep", [False, True])
def test_the_lab_goes_down_after_a_failed_story_unless_kept(
    calls: list[str], tmp_path: Path, keep: bool
) -> None:
    cfg = LabConfig(name="frame", root=tmp_path)
    console = Console(quiet=True)
    with pytest.raises(RuntimeError, match="story failed"), demo.demo_lab(cfg, keep, console):
        calls.append("story")
        raise RuntimeError("story failed")
    assert calls == ["up", "healthy", "story"] + ([] if keep else ["down"])


def test_an_unhealthy_lab_is_brought_down_before_any_story(
    calls: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def sick(cfg: LabConfig) -> None:
        raise LabError("slurmctld not answering")

    monkeypatch.setattr(demo, "check_healthy", sick)
    with (
        pytest.raises(LabError),
        demo.demo_lab(LabConfig(name="frame", root=tmp_path), False, Console(quiet=True)),
    ):
        calls.append("story")
    assert calls == ["up", "down"]
