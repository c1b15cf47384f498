"""The job grace period reaches the runbook: the shipped rules must not shadow the runner's
`grace_seconds` (they did: the rule's `autoheal_grace_seconds: 120` beat `lab up --grace 5`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from autoheal.paths import data_root
from remediation.app import create_app
from tests.remediation.remhelp import AUTH, alert, payload
from tests.support import wait_for

pytestmark = pytest.mark.timeout(120)


def test_runner_grace_reaches_the_play_with_the_shipped_rules(runtime_factory, tmp_path: Path) -> None:
    shutil.copy(data_root() / "config" / "rules.yaml", tmp_path / "shipped-rules.yaml")
    rt = runtime_factory(rules_file="shipped-rules.yaml", grace_seconds=7)
    with TestClient(create_app(rt)) as client:
        r = client.post("/webhook", json=payload(alert("gpu-1", xid=79, gpu=3)), headers=AUTH)
        [iid] = r.json()["created"]
        wait_for(lambda: rt.journal.runs_of(iid), 60, "a run for the incident")
        [run] = rt.journal.runs_of(iid)
        extravars = Path(run.private_dir) / "env" / "extravars"
        wait_for(extravars.exists, 60, "the run's extravars")
        assert json.loads(extravars.read_text())["autoheal_grace_seconds"] == 7
