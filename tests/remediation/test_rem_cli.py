"""The on-call CLI, through typer's runner, against a journal written by the intake."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from autoheal.xid import load_catalog
from remediation.cli import register
from remediation.config import load_config
from remediation.incidents import Intake
from remediation.journal import Journal
from remediation.models import WebhookPayload
from remediation.policy import BREAKER_KEY
from remediation.rules import load_rules
from remediation.states import IncidentState
from tests.remediation.remhelp import alert, payload, write_config


@pytest.fixture
def cli(tmp_path, monkeypatch):
    path = write_config(tmp_path)
    monkeypatch.setenv("AUTOHEAL_CONFIG", str(path))
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    cfg = load_config(path, env={})
    assert cfg.journal_path is not None
    journal = Journal(cfg.journal_path)
    intake = Intake(journal, load_rules(cfg.rules_file), load_catalog(), 900)
    hostile = alert("gpu-2")
    hostile["labels"]["note"] = "[bold red]pwned[/]"
    intake.record(WebhookPayload.model_validate(payload(alert("gpu-1"), hostile)))
    yield invoke, journal
    journal.close()


def test_every_command_has_help(cli):
    invoke, _ = cli
    for args in (
        ["--help"],
        ["serve", "--help"],
        ["incidents", "--help"],
        ["incident", "show", "--help"],
        ["pause", "--help"],
        ["resume", "--help"],
        ["breaker", "status", "--help"],
        ["breaker", "reset", "--help"],
        ["cancel", "--help"],
        ["run", "--help"],
    ):
        r = invoke(*args)
        assert r.exit_code == 0, (args, r.output)
        assert "Usage" in r.output


def test_incidents_lists_as_table_and_json(cli):
    invoke, _ = cli
    r = invoke("incidents", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.output)
    assert sorted(x["node"] for x in rows) == ["gpu-1", "gpu-2"]
    r = invoke("incidents")
    assert r.exit_code == 0 and "gpu-1" in r.output and "pending" in r.output
    assert invoke("incidents", "--state", "bogus").exit_code == 2


def test_incident_show_gives_the_timeline(cli):
    invoke, journal = cli
    iid = journal.incidents()[0].id
    data = json.loads(invoke("incident", "show", iid, "--json").output)
    assert data["incident"]["id"] == iid
    assert [t["phase"] for t in data["timeline"]] == ["received"]
    r = invoke("incident", "show", iid)
    assert r.exit_code == 0 and "received" in r.output
    assert invoke("incident", "show", "inc-000000000000").exit_code == 2


def test_pause_resume_are_stored_in_the_journal(cli):
    invoke, journal = cli
    assert invoke("pause", "--reason", "maintenance").exit_code == 0
    assert journal.setting("paused") is True
    assert invoke("resume").exit_code == 0
    assert journal.setting("paused") is False
    assert json.loads(invoke("pause", "--json").output) == {"paused": True, "reason": ""}


def test_breaker_status_and_reset(cli):
    invoke, journal = cli
    r = invoke("breaker", "status", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["open"] is False
    with journal.transaction() as tx:
        tx.set_setting(BREAKER_KEY, {"open": True, "reason": "storm", "tripped_at": tx.now})
        tx.transition(journal.incidents()[0].id, IncidentState.HELD, "breaker")
    r = invoke("breaker", "status")
    assert r.exit_code == 1 and "OPEN" in r.output and "storm" in r.output
    r = invoke("breaker", "reset", "--reason", "fixed the switch")
    assert r.exit_code == 0 and "1 held incident(s) requeued" in r.output
    assert json.loads(invoke("breaker", "status", "--json").output)["open"] is False
    assert journal.incidents(["held"]) == []


def test_cancel_marks_an_open_incident(cli):
    invoke, journal = cli
    iid = journal.incidents()[0].id
    r = invoke("cancel", iid, "--json")
    assert r.exit_code == 0 and json.loads(r.output)["cancel_requested"] is True
    assert journal.incident(iid).cancel_requested
    assert invoke("cancel", "inc-ffffffffffff").exit_code == 2


def test_run_refuses_a_hostile_node_name(cli):
    invoke, _ = cli
    r = invoke("run", "gpu_fatal_xid.yml", "--node", "$(reboot)", "--check")
    assert r.exit_code == 2 and "not a valid node name" in r.output


def test_bad_config_is_a_clear_error(cli, tmp_path):
    invoke, _ = cli
    r = invoke("incidents", "--config", str(tmp_path / "nope.yaml"))
    assert r.exit_code == 2 and "cannot read" in r.output
