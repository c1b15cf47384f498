"""Stack config validation: a wrong value fails with a message naming the key and the expected
type; the shipped stack files are valid; Pulumi.yaml's schema and the model agree; the images the
config does not name come from the lock file `autoheal images build` writes."""

from __future__ import annotations

import json
import runpy
from collections.abc import Callable
from typing import Any

import pulumi
import pytest
import yaml

from autoheal.errors import ConfigError
from components.config import (
    SCALAR_KEYS,
    STRUCTURED_KEYS,
    StackSpec,
    load_runner_files,
    parse_stack_config,
    read_image_lock,
    read_stack_config,
    with_locked_images,
)
from tests.components.harness import ROOT, Recorded, lab_stack_raw, run_program

POOL = {"name": "h100", "prefix": "gpu", "size": 4, "spares": 2}
CLUSTER = {"backend": "kubeconfig", "kubeconfig": "kc"}


def _pulumi_get(values: dict[str, Any]) -> Callable[[str], str | None]:
    """What pulumi.Config().get returns: strings, objects and arrays as JSON text."""

    def get(key: str) -> str | None:
        if key not in values:
            return None
        v = values[key]
        return v if isinstance(v, str) else json.dumps(v)

    return get


def _error(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        read_stack_config(_pulumi_get(raw))
    return str(exc.value)


def test_pool_size_of_the_wrong_type_names_the_key_and_the_type():
    msg = _error({"cluster": CLUSTER, "pools": [{**POOL, "size": "four"}]})
    assert "autoheal:pools[0].size: expected an integer, got 'four'" in msg


def test_boolean_key_with_a_non_boolean_names_the_key():
    msg = _error({"cluster": CLUSTER, "pools": [POOL], "waitForRollout": "maybe"})
    assert "autoheal:waitForRollout: expected a boolean" in msg


def test_nested_string_list_with_a_number_names_the_index():
    msg = _error({"cluster": CLUSTER, "pools": [POOL], "slurm": {"authorizedKeys": [42]}})
    assert "autoheal:slurm.authorizedKeys[0]: expected a string, got 42" in msg


def test_misspelled_key_is_reported_as_unknown():
    msg = _error({"cluster": CLUSTER, "pools": [{**POOL, "spare": 1}]})
    assert "autoheal:pools[0].spare: unknown key" in msg


def test_missing_required_keys_are_named():
    msg = _error({})
    assert "autoheal:cluster: required, but not set" in msg
    assert "autoheal:pools: required, but not set" in msg


def test_object_key_that_is_not_json_says_what_was_expected():
    msg = _error({"cluster": CLUSTER, "pools": "h100"})
    assert msg.startswith("autoheal:pools: expected a list")


def test_cross_field_rules_name_their_key():
    no_path = _error({"cluster": {"backend": "kubeconfig"}, "pools": [POOL]})
    assert "autoheal:cluster: backend 'kubeconfig' needs 'kubeconfig'" in no_path
    twice = _error({"cluster": CLUSTER, "pools": [POOL, {**POOL, "name": "other"}]})
    assert "pool prefixes must be unique (pools), repeated: gpu" in twice
    bad_name = _error({"cluster": CLUSTER, "pools": [{**POOL, "name": "H100"}]})
    assert "autoheal:pools[0].name: must be a DNS label" in bad_name
    assert "got 'H100'" in bad_name


def test_scalars_arrive_as_strings_and_are_coerced():
    cfg = read_stack_config(
        _pulumi_get({"cluster": CLUSTER, "pools": [POOL], "waitForRollout": "false", "namespace": "ah"})
    )
    assert cfg.wait_for_rollout is False and cfg.namespace == "ah"


def test_lab_stack_file_is_valid_and_matches_the_lab():
    cfg = parse_stack_config(lab_stack_raw())
    (pool,) = cfg.pools
    assert (pool.name, pool.node_prefix, pool.size, pool.spares, pool.gpus_per_node) == (
        "h100",
        "gpu",
        4,
        2,
        8,
    )
    assert cfg.cluster.kubeconfig == ".lab/default/kubeconfig"


def test_example_eks_stack_file_is_valid():
    doc = yaml.safe_load((ROOT / "Pulumi.example-eks.yaml").read_text())
    raw = {k.split(":", 1)[1]: v for k, v in doc["config"].items() if k.startswith("autoheal:")}
    cfg = parse_stack_config(raw)
    assert cfg.cluster.backend == "eks"
    assert all(p.eks is not None for p in cfg.pools)


def test_project_schema_declares_exactly_the_models_keys_with_the_same_defaults():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "autoheal"
    assert project["runtime"]["options"]["virtualenv"] == ".venv"
    schema = project["config"]
    assert set(schema) == set(SCALAR_KEYS) | set(STRUCTURED_KEYS)
    fields = {f.alias or name: f for name, f in StackSpec.model_fields.items()}
    for key, decl in schema.items():
        assert decl["type"] in {"string", "boolean", "object", "array"}, key
        if "default" in decl and decl["type"] != "object":
            assert fields[key].default == decl["default"], key
        if "default" not in decl:
            assert fields[key].is_required(), key


def test_runner_files_come_from_the_repository():
    cfg = parse_stack_config(lab_stack_raw())
    rules, playbooks = load_runner_files(ROOT, cfg.runner)
    assert "GpuXidFatal" in rules
    assert all(name.endswith((".yml", ".yaml")) for name in playbooks)


def test_missing_rules_file_names_the_key(tmp_path):
    cfg = parse_stack_config({"cluster": CLUSTER, "pools": [POOL], "runner": {"rulesFile": "nope.yaml"}})
    with pytest.raises(ConfigError, match=r"autoheal:runner\.rulesFile"):
        load_runner_files(tmp_path, cfg.runner)


def _run_main(config: dict[str, Any]) -> Recorded:
    raw = {f"autoheal:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}

    def program() -> None:
        runpy.run_path(str(ROOT / "__main__.py"))

    return run_program(program, config=raw)


def test_main_builds_the_lab_stack_from_pulumi_config():
    rec = _run_main(lab_stack_raw())
    assert rec.one("kubernetes:core/v1:ConfigMap", "autoheal-pool-h100")
    runner = rec.one("kubernetes:core/v1:ConfigMap", "autoheal-runner-config")
    assert "rules.yaml" in runner.inputs["data"]  # the playbooks come from the runner's image


def test_main_reports_a_bad_value_as_a_run_error_naming_the_key():
    bad = {**lab_stack_raw(), "pools": [{"name": "h100", "size": "four"}]}
    with pytest.raises(pulumi.RunError, match=r"autoheal:pools\[0\]\.size: expected an integer"):
        _run_main(bad)


# --- the image lock file -------------------------------------------------------------------------

SLURM_REF = "reg.example.com/t/autoheal-slurm@sha256:" + "2" * 64
RUNNER_REF = "reg.example.com/t/autoheal-runner@sha256:" + "3" * 64
MINE = "reg.example.com/mine/img@sha256:" + "4" * 64


def _write_lock(root, doc: Any) -> None:
    (root / "images.lock.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))


def test_the_lock_file_fills_the_images_the_config_does_not_name(tmp_path):
    _write_lock(tmp_path, {"version": 1, "images": {"slurm": SLURM_REF, "runner": RUNNER_REF}})
    raw = {"cluster": CLUSTER, "pools": [POOL], "slurm": {"images": {"login": MINE}}}
    cfg = with_locked_images(read_stack_config(_pulumi_get(raw)), read_image_lock(tmp_path))
    images = cfg.slurm.images
    assert (images.controller, images.slurmd, images.munge) == (SLURM_REF,) * 3
    assert images.login == MINE  # explicit config wins
    assert cfg.runner.image == RUNNER_REF and cfg.monitoring.watcher_image == RUNNER_REF
    assert cfg.monitoring.dcgm_image is None  # NVIDIA's image is not ours to lock


def test_explicit_runner_and_watcher_images_win_over_the_lock():
    raw = {
        "cluster": CLUSTER,
        "pools": [POOL],
        "runner": {"image": MINE},
        "monitoring": {"watcherImage": MINE},
        "slurm": {"images": dict.fromkeys(("controller", "slurmd", "login", "munge"), MINE)},
    }
    cfg = read_stack_config(_pulumi_get(raw))
    assert with_locked_images(cfg, {"slurm": SLURM_REF, "runner": RUNNER_REF}) == cfg


def test_without_a_lock_file_the_config_keeps_its_defaults(tmp_path):
    cfg = read_stack_config(_pulumi_get({"cluster": CLUSTER, "pools": [POOL]}))
    assert read_image_lock(tmp_path) == {}
    assert with_locked_images(cfg, read_image_lock(tmp_path)) == cfg
    assert cfg.runner.image is None and cfg.slurm.images.slurmd is None


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ('{"version": 1, "images": {', "not valid JSON"),
        ([], "expected a JSON object"),
        ({"version": 2, "images": {}}, "version: expected 1, got 2"),
        ({"images": {}}, "version: expected 1, got None"),
        ({"version": 1, "images": ["slurm"]}, "images: expected an object"),
        ({"version": 1, "images": {"slurm": "ghcr.io/autoheal/slurm:24.11"}}, "images.slurm: expected a ref"),
        ({"version": 1, "images": {"runner": 7}}, "images.runner: expected a reference by digest"),
        ({"version": 1, "images": {}, "digests": {}}, "digests: unknown key"),
    ],
)
def test_a_malformed_lock_file_is_a_config_error_naming_the_file_and_the_key(tmp_path, doc, named):
    _write_lock(tmp_path, doc)
    with pytest.raises(ConfigError) as exc:
        read_image_lock(tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{tmp_path / 'images.lock.json'}: ") and named in msg, msg


HA_RUNNER = {
    "journal": "postgres",
    "replicas": 3,
    "postgres": {"url": "postgresql://autoheal@db:5432/autoheal", "password": {"name": "journal-db"}},
}


def test_the_ha_runner_is_declared_with_journal_postgres_and_replicas():
    cfg = parse_stack_config({"cluster": CLUSTER, "pools": [POOL], "runner": HA_RUNNER})
    rc = cfg.runner
    assert (rc.journal, rc.replicas) == ("postgres", 3)
    assert rc.postgres is not None and rc.postgres.password is not None
    assert (rc.postgres.url, rc.postgres.password.name, rc.postgres.password.key) == (
        "postgresql://autoheal@db:5432/autoheal",
        "journal-db",
        "password",
    )
    default = parse_stack_config({"cluster": CLUSTER, "pools": [POOL]}).runner
    assert (default.journal, default.postgres, default.replicas) == ("sqlite", None, 1)


@pytest.mark.parametrize(
    ("runner", "named"),
    [
        ({"replicas": 2}, "autoheal:runner.replicas: replicas=2 needs journal='postgres'"),
        ({"replicas": 0}, "autoheal:runner.replicas: replicas must be at least 1"),
        ({"journal": "postgres"}, "autoheal:runner.postgres: journal 'postgres' needs postgres"),
        ({"postgres": HA_RUNNER["postgres"]}, "autoheal:runner.postgres: postgres is only for journal"),
        ({"journal": "mysql"}, "autoheal:runner.journal: Input should be 'sqlite' or 'postgres'"),
        (
            {**HA_RUNNER, "postgres": {"url": "postgresql://autoheal:hunter2@db/autoheal"}},
            "autoheal:runner.postgres.url: postgres.url must not carry a password",
        ),
        (
            {**HA_RUNNER, "postgres": {"url": "postgresql://autoheal@db/autoheal?password=hunter2"}},
            "autoheal:runner.postgres.url: postgres.url must not carry a password",
        ),
        (
            {**HA_RUNNER, "postgres": {"url": "host=db user=autoheal"}},
            "autoheal:runner.postgres.url: postgres.url must be a postgresql:// URL",
        ),
        (
            {**HA_RUNNER, "postgres": {"url": HA_RUNNER["postgres"]["url"], "password": {"key": "pw"}}},
            "autoheal:runner.postgres.password.name: required",
        ),
    ],
)
def test_ha_runner_mistakes_name_their_key(runner, named):
    msg = _error({"cluster": CLUSTER, "pools": [POOL], "runner": runner})
    assert named in msg
    assert "hunter2" not in msg  # a refused URL is not echoed: it may carry the password


def test_a_pool_backend_defaults_to_none_on_an_existing_cluster_and_is_checked():
    cfg = read_stack_config(
        _pulumi_get(
            {
                "cluster": CLUSTER,
                "pools": [POOL, {**POOL, "name": "b", "prefix": "b", "backend": "karpenter"}],
            }
        )
    )
    assert [cfg.backend(p) for p in cfg.pools] == ["none", "karpenter"]
    msg = _error({"cluster": CLUSTER, "pools": [{**POOL, "backend": "gcp"}]})
    assert "autoheal:pools[0].backend" in msg and "'karpenter'" in msg
