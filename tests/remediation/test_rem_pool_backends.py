"""Each pool's backend reaches its incidents' plays: the stack writes `pool_backends`, the policy
round looks up the node's pool, and the admitted incident carries `autoheal_backend` (unless its
rule set one), so a batch never mixes pools of different backends."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autoheal.xid import load_catalog
from remediation.config import RunnerConfig
from remediation.errors import RunnerConfigError
from remediation.kubeview import FakeKube
from remediation.policy import BACKEND_VAR, Policy
from tests.remediation.remhelp import AUTH, alert, payload
from tests.support import wait_for

pytestmark = pytest.mark.timeout(180)
POOLS = {"gpu-1": {"autoheal.io/pool": "h100"}, "gpu-2": {"autoheal.io/pool": "a100"}, "gpu-3": {}}


def _open(journal, node, extra_vars=None):
    with journal.transaction() as tx:
        return tx.create_incident(
            node=node,
            gpu=0,
            xid=79,
            fault_class="gpu-fatal",
            tier="replace",
            fingerprint=f"fp-{node}",
            rule="r",
            playbook="gpu_fatal_xid.yml",
            extra_vars=extra_vars or {},
            rule_dry_run=False,
        )


def test_the_nodes_pool_names_the_backend_and_the_rule_wins(config_factory, journal_target):
    journal = journal_target.open()
    cfg = config_factory(pool_backends={"h100": "aws", "a100": "karpenter"})
    a, b, c = _open(journal, "gpu-1"), _open(journal, "gpu-2"), _open(journal, "gpu-3")
    d = _open(journal, "gpu-4", {BACKEND_VAR: "none"})
    kube = FakeKube({**POOLS, "gpu-4": {"autoheal.io/pool": "h100"}})
    decisions, _ = Policy(cfg, journal, kube, load_catalog()).decide(
        journal.incidents(["pending"]), time.time()
    )
    by = {x.incident_id: x.backend for x in decisions}
    # gpu-3 is in no pool, gpu-4's rule chose: the play's own default (play_vars) or the rule's stand
    assert by == {a: "aws", b: "karpenter", c: None, d: None}


def test_a_pool_backend_must_be_one_the_runbook_knows(tmp_path: Path, config_factory) -> None:
    with pytest.raises(RunnerConfigError, match="pool_backends"):
        config_factory(pool_backends={"h100": "gcp"})
    with pytest.raises(RunnerConfigError, match="DNS labels"):
        config_factory(pool_backends={"H100!": "aws"})


def _extravars(rt, run_id: int) -> dict:
    run = rt.journal.run(run_id)
    return json.loads((Path(run.private_dir) / "env" / "extravars").read_text())


def test_admitted_incidents_run_with_their_pools_backend_one_batch_per_backend(
    runtime_factory, kube, effects
):
    from starlette.testclient import TestClient

    from remediation.app import create_app

    kube.nodes.update(POOLS)
    rt = runtime_factory(pool_backends={"h100": "aws", "a100": "karpenter"}, play_vars={BACKEND_VAR: "none"})
    with TestClient(create_app(rt)) as client:
        r = client.post(
            "/webhook", json=payload(alert("gpu-1"), alert("gpu-2"), alert("gpu-3")), headers=AUTH
        )
        ids = r.json()["created"]
        closed = ["completed", "failed", "cancelled", "quarantined"]
        wait_for(lambda: len(rt.journal.incidents(closed)) >= 3, 120, "the three incidents to close")
    incs = {i: rt.journal.incident(i) for i in ids}
    runs = {inc.node: _extravars(rt, inc.run_id) for inc in incs.values()}
    # the stored incident keeps the choice (a resumed run after a restart plays the same backend)
    assert {inc.node: inc.extra_vars.get(BACKEND_VAR) for inc in incs.values()} == {
        "gpu-1": "aws",
        "gpu-2": "karpenter",
        "gpu-3": None,
    }
    assert {n: v[BACKEND_VAR] for n, v in runs.items()} == {
        "gpu-1": "aws",
        "gpu-2": "karpenter",
        "gpu-3": "none",
    }
    assert len({inc.run_id for inc in incs.values()}) == 3, "pools of different backends never share a batch"


def test_the_config_type_is_the_cores_list() -> None:
    from typing import get_args

    from autoheal.backends import POOL_BACKENDS, PoolBackendName

    assert get_args(PoolBackendName) == POOL_BACKENDS
    assert RunnerConfig.model_fields["pool_backends"].annotation == dict[str, PoolBackendName]


def test_autoheal_incidents_shows_each_incidents_backend(tmp_path: Path, monkeypatch) -> None:
    import typer
    from typer.testing import CliRunner

    from remediation.cli import register
    from remediation.config import load_config
    from remediation.journal import Journal
    from tests.remediation.remhelp import write_config

    path = write_config(tmp_path, play_vars={BACKEND_VAR: "lab"})
    monkeypatch.setenv("AUTOHEAL_CONFIG", str(path))
    cfg = load_config(path, env={})
    assert cfg.journal_path is not None
    journal = Journal(cfg.journal_path)
    _open(journal, "gpu-1", {BACKEND_VAR: "aws"})
    _open(journal, "gpu-2")
    journal.close()
    app = typer.Typer()
    register(app)
    r = CliRunner().invoke(app, ["incidents", "--json"])
    assert r.exit_code == 0, r.output
    assert {x["node"]: x["backend"] for x in json.loads(r.output)} == {"gpu-1": "aws", "gpu-2": "lab"}
    r = CliRunner().invoke(app, ["incidents"], env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "backend" in r.output and "aws" in r.output
