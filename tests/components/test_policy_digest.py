"""images-pinned-by-digest: every container of every workload names its image by digest, and the
lab's real-node stack declares the digests `autoheal images build` produced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from images.build import BuiltImage
from lab import stack
from lab.config import LabConfig
from policy.rules import images_pinned_by_digest

DIGEST = "sha256:" + "ab" * 32


def _deployment(*images: str, init: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": f"c{i}", "image": im} for i, im in enumerate(images)]}
    if init:
        spec["initContainers"] = [{"name": "init", "image": init}]
    return {"metadata": {"name": "w"}, "spec": {"template": {"spec": spec}}}


def test_images_by_digest_pass() -> None:
    props = _deployment(f"localhost/autoheal/slurm@{DIGEST}", init=f"reg.io/x:1@{DIGEST}")
    assert images_pinned_by_digest("kubernetes:apps/v1:DaemonSet", props) == []


@pytest.mark.parametrize(
    "image",
    ["ghcr.io/autoheal/slurm:24.11", "busybox", "reg.io/x@sha256:abc", f"reg.io/x@md5:{'a' * 64}"],
)
def test_a_tag_or_a_malformed_digest_is_a_violation(image: str) -> None:
    (msg,) = images_pinned_by_digest("kubernetes:apps/v1:Deployment", _deployment(f"ok@{DIGEST}", image))
    assert "w: container c1" in msg and repr(image) in msg and "sha256" in msg


def test_init_containers_are_checked_and_other_kinds_ignored() -> None:
    props = _deployment(f"ok@{DIGEST}", init="munge:latest")
    assert len(images_pinned_by_digest("kubernetes:apps/v1:StatefulSet", props)) == 1
    assert images_pinned_by_digest("kubernetes:core/v1:ConfigMap", props) == []
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}}
    assert len(images_pinned_by_digest("kubernetes:core/v1:Pod", pod)) == 1


def test_the_lab_real_node_stack_declares_the_built_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = LabConfig(name="a-digest", root=tmp_path, real_nodes=1)
    cfg.run_dir.mkdir(parents=True)

    def built(_: LabConfig) -> dict[str, str]:
        img = {
            n: BuiltImage(n, "k", f"localhost/autoheal/{n}", "t", DIGEST, "/x", 1, 0.0, True).ref
            for n in ("slurm", "runner")
        }
        return img

    monkeypatch.setattr(stack, "built_images", built)
    import yaml

    conf = yaml.safe_load(stack._config_file(cfg).read_text())["config"]
    slurm = conf["autoheal:slurm"]
    assert set(slurm["images"].values()) == {f"localhost/autoheal/slurm@{DIGEST}"}
    assert conf["autoheal:runner"]["image"] == f"localhost/autoheal/runner@{DIGEST}"
    assert slurm["waitForRollout"] is True and slurm["loginServiceType"] == "NodePort"
    assert slurm["authorizedKeys"][-1].startswith("ssh-ed25519 ")
