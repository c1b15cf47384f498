"""The runner's `slurm` settings for the existing backend (remediation/config.py): what parses, and
each mistake's error naming its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from autoheal.slurmrest import SignedToken, TokenFile
from remediation.config import load_config
from remediation.errors import RunnerConfigError
from remediation.slurm_existing import rest_client

REPO = Path(__file__).resolve().parents[2]
BASE = {"token_file": "t", "rules_file": "r", "playbook_dir": "p", "state_dir": "s", "journal_path": "j.db"}


def load(tmp_path: Path, slurm: Any) -> Any:
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump({**BASE, "slurm": slurm}))
    return load_config(path, env={})


def test_the_shipped_example_is_the_own_backend() -> None:
    cfg = load_config(REPO / "config" / "runner.yaml", env={})
    assert cfg.slurm.backend == "own" and cfg.slurm.rest is None and cfg.slurm.node_map.rule == "same"


def test_existing_with_a_signed_token_and_pod_hostname(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        {
            "backend": "existing",
            "rest": {
                "url": "http://slurm-restapi.slurm:6820",
                "jwt_key_file": "keys/jwt.key",
                "token_lifespan_s": 600,
            },
            "node_map": {"rule": "pod-hostname", "selector": "app.kubernetes.io/name=slurmd"},
        },
    )
    rest = cfg.slurm.rest
    assert rest is not None and rest.jwt_key_file == (tmp_path / "keys/jwt.key").resolve()  # beside the file
    client = rest_client(rest)
    assert isinstance(client.tokens, SignedToken) and client.tokens.lifespan == 600 and client.user == "slurm"
    client.close()


def test_existing_with_a_token_file(tmp_path: Path) -> None:
    cfg = load(
        tmp_path, {"backend": "existing", "rest": {"url": "https://r:6820", "token_file": "/run/s/token"}}
    )
    assert cfg.slurm.rest is not None
    client = rest_client(cfg.slurm.rest)
    assert isinstance(client.tokens, TokenFile) and client.tokens.path == Path("/run/s/token")
    client.close()


@pytest.mark.parametrize(
    ("slurm", "says"),
    [
        ({"backend": "existing"}, "slurm: Value error, rest: backend existing needs rest"),
        ({"backend": "slinky"}, "slurm.backend: Input should be 'own' or 'existing'"),
        (
            {"backend": "existing", "rest": {"url": "http://r:6820"}},
            "slurm.rest: Value error, token_file: set exactly one",
        ),
        (
            {"backend": "existing", "rest": {"url": "http://r", "token_file": "/t", "jwt_key_file": "/k"}},
            "slurm.rest: Value error, token_file: set exactly one",
        ),
        (
            {"backend": "existing", "rest": {"url": "r:6820", "token_file": "/t"}},
            "slurm.rest.url: String should match",
        ),
        (
            {
                "backend": "existing",
                "rest": {"url": "http://r", "token_file": "/t", "api_version": "v0.0.40"},
            },
            "slurm.rest.api_version: Input should be 'v0.0.45' or 'v0.0.44'",
        ),
        (
            {"backend": "existing", "rest": {"url": "http://r", "token_file": "/t", "token_lifespan_s": 1}},
            "slurm.rest.token_lifespan_s: Input should be greater than or equal to 10",
        ),
        (
            {"node_map": {"rule": "pod-hostname"}},
            "slurm.node_map: Value error, selector: rule pod-hostname needs",
        ),
        (
            {"node_map": {"rule": "annotation"}},
            "slurm.node_map: Value error, annotation: rule annotation needs",
        ),
        ({"node_map": {"rule": "hostname"}}, "slurm.node_map.rule: Input should be 'same', 'pod-hostname'"),
        ({"rest_url": "http://r"}, "slurm.rest_url: Extra inputs are not permitted"),
    ],
)
def test_a_mistake_names_its_field(tmp_path: Path, slurm: Any, says: str) -> None:
    with pytest.raises(RunnerConfigError) as err:
        load(tmp_path, slurm)
    assert says in str(err.value), str(err.value)
