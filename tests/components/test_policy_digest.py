"""images-pinned-by-digest: every container of every workload names its image by digest, and the
lab's real-node stack declares the digests `autoheal images build` produced. The rule is
mandatory; the stack defaults to the lock file the builder writes, and without one its tag
defaults are refused with the stack config key to set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    conf = yaml.safe_load(stack._config_file(cfg).read_text())["config"]
    slurm = conf["autoheal:slurm"]
    assert set(slurm["images"].values()) == {f"localhost/autoheal/slurm@{DIGEST}"}
    assert conf["autoheal:runner"]["image"] == f"localhost/autoheal/runner@{DIGEST}"
    assert slurm["waitForRollout"] is True and slurm["loginServiceType"] == "NodePort"
    assert slurm["authorizedKeys"][-1].startswith("ssh-ed25519 ")


# --- the rule in the pack, and the stack's images ------------------------------------------------

LOCKED = {
    "slurm": f"reg.example.com/t/autoheal-slurm@sha256:{'2' * 64}",
    "runner": f"reg.example.com/t/autoheal-runner@sha256:{'3' * 64}",
    "pause": f"reg.example.com/t/autoheal-pause@sha256:{'1' * 64}",
}
RULE = "images-pinned-by-digest"
BUILD_FIX = "autoheal images build --push REGISTRY"


def test_the_rule_is_mandatory_in_the_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    """policy/__main__.py as the engine runs it (the pack captured instead of serving gRPC): the
    rule refuses a preview, and the pack's rules without its runtime (judge: the review's mocked
    stacks, policy.preview_check) apply it too."""
    import runpy

    import pulumi_policy

    from policy import rules

    levels: dict[str, pulumi_policy.EnforcementLevel] = {}

    class FakePack:
        def __init__(self, name: str, policies: list[Any], **kw: Any) -> None:
            levels.update({p.name: p.enforcement_level for p in policies})

    monkeypatch.setattr(pulumi_policy, "PolicyPack", FakePack)
    runpy.run_path(str(Path(rules.__file__).with_name("__main__.py")), run_name="__main__")
    assert levels[RULE] == pulumi_policy.EnforcementLevel.MANDATORY
    assert rules.RESOURCE_RULES[RULE] is images_pinned_by_digest
    tagged = _deployment("ghcr.io/autoheal/runner:0.3.0")
    assert [r for r, _, _ in rules.judge([("urn:w", "kubernetes:apps/v1:Deployment", tagged)])] == [RULE]


def _violations(rec: Any) -> dict[tuple[str, str], str]:
    """(workload, container) -> the rule's message, for every container the rule refuses."""
    import re

    out = {}
    for r in rec.resources:
        for msg in images_pinned_by_digest(r.type, r.inputs):
            m = re.match(r"(\S+): container (\S+) image", msg)
            assert m, msg
            out[(m[1], m[2])] = msg
    return out


def _workload_images(rec: Any) -> dict[tuple[str, str], str]:
    from policy.rules import WORKLOAD_TYPES, _pod_spec

    return {
        (r.inputs["metadata"]["name"], c["name"]): c["image"]
        for r in rec.resources
        if r.type in WORKLOAD_TYPES
        for f in ("initContainers", "containers")
        for c in _pod_spec(r.type, r.inputs).get(f) or []
    }


def test_the_lab_stack_and_the_eks_example_pass_the_rule(lab: Any) -> None:
    """Pulumi.lab.yaml (every workload of the stack, dcgm-exporter included) and the EKS example,
    under mocks: every image by digest. The rule had something to judge in each."""
    from components.config import parse_stack_config
    from components.stack import build_stack
    from tests.components.harness import ROOT, run_program

    assert len(_workload_images(lab)) >= 15 and _violations(lab) == {}
    doc = yaml.safe_load((ROOT / "Pulumi.example-eks.yaml").read_text())
    cfg = parse_stack_config({k.split(":", 1)[1]: v for k, v in doc["config"].items()})
    eks = run_program(lambda: build_stack(cfg, ROOT, "rules: []\n", {}))
    images = _workload_images(eks)
    assert len(images) >= 15 and _violations(eks) == {}
    assert images[("dcgm-exporter", "dcgm-exporter")].startswith("nvcr.io/nvidia/k8s/dcgm-exporter@sha256:")


def _project(tmp_path: Path, lock: dict[str, Any] | str | None) -> Path:
    """A Pulumi project folder with the stack's own __main__.py and, maybe, a lock file."""
    from tests.components.harness import ROOT

    project = tmp_path / "project"
    project.mkdir(parents=True)
    (project / "__main__.py").write_text((ROOT / "__main__.py").read_text())
    if lock is not None:
        text = lock if isinstance(lock, str) else json.dumps(lock)
        (project / "images.lock.json").write_text(text)
    return project


def _tag_defaults_config(**changes: Any) -> dict[str, str]:
    """Pulumi.lab.yaml without its image keys (the stack's defaults), as Pulumi passes config."""
    from tests.components.harness import ROOT, lab_stack_raw

    raw = lab_stack_raw()
    raw["slurm"].pop("images")
    raw["runner"].pop("image")
    raw["monitoring"] = {}
    raw["runner"].update(rulesFile=str(ROOT / "config/rules.yaml"), playbooksDir=str(ROOT / "playbooks"))
    for key, value in changes.items():
        raw[key] = {**raw.get(key, {}), **value}
    return {f"autoheal:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}


def _run_main(project: Path, config: dict[str, str]) -> Any:
    import runpy

    from tests.components.harness import run_program

    return run_program(lambda: runpy.run_path(str(project / "__main__.py")), config=config)


def test_a_stack_without_a_lock_fails_the_rule_naming_each_containers_fix(tmp_path: Path) -> None:
    rec = _run_main(_project(tmp_path, None), _tag_defaults_config())
    found = _violations(rec)
    assert set(found) == set(_workload_images(rec))  # every container of the stack: all tags
    keys = {
        ("slurmctld", "slurmctld"): "slurm.images.controller",
        ("slurmctld", "state-owner"): "slurm.images.controller",
        ("slurmctld", "munged"): "slurm.images.munge",
        ("slurm-login", "sshd"): "slurm.images.login",
        ("slurm-login", "munge-key"): "slurm.images.munge",
        ("slurmd-h100", "slurmd"): "slurm.images.slurmd",
        ("slurmd-h100", "munged"): "slurm.images.munge",
        ("autoheal-runner", "runner"): "runner.image",
        ("autoheal-runner", "munged"): "runner.image",  # the runner's munge runs from its image
        ("xid-watcher", "xid-watcher"): "monitoring.watcherImage",
    }
    for where, key in keys.items():
        msg = found[where]
        assert f"set autoheal:{key} to a reference by digest" in msg and BUILD_FIX in msg, msg
        assert "'ghcr.io/autoheal/" in msg, msg
    dcgm = found[("dcgm-exporter", "dcgm-exporter")]
    assert "'nvcr.io/nvidia/k8s/dcgm-exporter:" in dcgm
    assert "autoheal:monitoring.dcgmImage" in dcgm and "autoheal:monitoring.dcgmExporter: false" in dcgm
    assert BUILD_FIX not in dcgm  # no build of ours makes NVIDIA's image


def test_the_lock_file_is_the_stacks_default_and_explicit_config_wins(tmp_path: Path) -> None:
    mine = f"reg.example.com/mine/slurmd@sha256:{'4' * 64}"
    config = _tag_defaults_config(slurm={"images": {"slurmd": mine}})
    rec = _run_main(_project(tmp_path, {"version": 1, "images": LOCKED}), config)
    images = _workload_images(rec)
    assert images.pop(("slurmd-h100", "slurmd")) == mine
    dcgm = images.pop(("dcgm-exporter", "dcgm-exporter"))
    slurm = {v for (w, _), v in images.items() if w.startswith("slurm")}
    runner = {v for (w, _), v in images.items() if not w.startswith("slurm")}
    assert slurm == {LOCKED["slurm"]} and runner == {LOCKED["runner"]}
    # only NVIDIA's image is left: no digest of it ships, the stack must name one or not run it
    assert list(_violations(rec)) == [("dcgm-exporter", "dcgm-exporter")] and "@" not in dcgm
    off = _run_main(
        _project(tmp_path / "2", {"version": 1, "images": LOCKED}),
        _tag_defaults_config(monitoring={"dcgmExporter": False}),
    )
    assert _violations(off) == {}


def test_a_malformed_lock_fails_the_stack_naming_the_file_and_the_key(tmp_path: Path) -> None:
    import pulumi

    project = _project(tmp_path, {"version": 1, "images": {**LOCKED, "runner": "reg/runner:1"}})
    with pytest.raises(pulumi.RunError, match=r"project/images\.lock\.json: images\.runner: expected a ref"):
        _run_main(project, _tag_defaults_config())
