"""Rules and runner config: validated at load, errors name the file, the rule and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from remediation.config import load_config
from remediation.errors import RulesError, RunnerConfigError
from remediation.rules import load_rules, parse_condition, parse_rules
from tests.remediation.remhelp import RULES

REPO = Path(__file__).resolve().parents[2]


def _rule(**changes):
    rule = {**RULES[0]["rules"][0], **changes}
    return [{"name": "set", "rules": [rule]}]


def test_shipped_example_rules_route_gpu_xid_fatal_to_the_runbook():
    rules = load_rules(REPO / "config" / "rules.yaml")
    rule = rules.route({"alertname": "GpuXidFatal", "Hostname": "gpu-1", "xid": "79"})
    assert rule is not None and rule.playbook == "gpu_fatal_xid.yml"
    assert rules.route({"alertname": "Other"}) is None
    # the routing settings come from the action's extra vars and are not passed to the play
    assert rule.fault_class == "gpu-fatal" and rule.node_labels == ("node", "Hostname")
    assert "autoheal_routing" not in rule.extra_vars


def test_shipped_example_runner_config_loads(tmp_path):
    cfg = load_config(REPO / "config" / "runner.yaml", env={})
    assert cfg.playbook_dir == REPO / "playbooks"
    assert cfg.rules_file == REPO / "config" / "rules.yaml"
    assert cfg.budgets.max_nodes >= 1


def test_environment_overrides_config(tmp_path):
    cfg = load_config(
        REPO / "config" / "runner.yaml",
        env={"AUTOHEAL_DRY_RUN": "true", "AUTOHEAL_JOURNAL_PATH": str(tmp_path / "j")},
    )
    assert cfg.dry_run and cfg.journal_path == tmp_path / "j"


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"condition": "event.alert.labels.alertname =~ 'x'"}, "condition"),
        ({"condition": 'event.alert.labels.severity == "critical"'}, "condition"),
        ({"action": {"run_playbook": {"name": "../../etc/passwd.yml"}}}, "action.run_playbook.name"),
        (
            {"action": {"run_playbook": {"name": "x.yml", "extra_vars": {"autoheal_nodes": "a"}}}},
            "extra_vars",
        ),
        ({"action": {"run_playbook": {"name": "x.yml", "extra_vars": {"a": "{{ evil }}"}}}}, "extra_vars"),
        ({"action": {"run_playbook": {"name": "x.yml", "extra_vars": {"a": [1, 2]}}}}, "extra_vars"),
        ({"throttle": {"once_within": "soon"}}, "throttle.once_within"),
        (
            {
                "action": {
                    "run_playbook": {"name": "x.yml", "extra_vars": {"autoheal_routing": {"dry_rn": True}}}
                }
            },
            "action.run_playbook.extra_vars.autoheal_routing.dry_rn",
        ),
        (
            {"action": {"run_playbook": {"name": "x.yml", "extra_vars": {"autoheal_routing": "yes"}}}},
            "action.run_playbook.extra_vars.autoheal_routing: must be a mapping",
        ),
        # the pre-0.3 place, which ansible-rulebook refuses: the error says where it moved
        ({"autoheal": {"dry_run": True}}, "autoheal: move this block to action.run_playbook.extra_vars"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_rule_error_names_file_rule_and_key(changes, key):
    with pytest.raises(RulesError) as err:
        parse_rules(_rule(**changes), "rules.yaml")
    msg = str(err.value)
    assert msg.startswith("rules.yaml: ruleset 'set', rule 'GPU fatal XID'"), msg
    assert key in msg, msg


def test_rules_file_must_be_a_list_and_readable(tmp_path):
    with pytest.raises(RulesError, match="non-empty list"):
        parse_rules({"rules": []}, "r.yaml")
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- [unclosed")
    with pytest.raises(RulesError, match="not valid YAML"):
        load_rules(bad)


def test_condition_subset_matches_labels():
    terms = parse_condition('event.alert.labels.alertname == "A" and event.alert.labels.x != "y"')
    assert all(t.matches({"alertname": "A", "x": "z"}) for t in terms)
    assert not all(t.matches({"alertname": "A", "x": "y"}) for t in terms)


def test_invalid_runner_config_names_the_key(tmp_path):
    path = tmp_path / "runner.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "token_file": "t",
                "journal_path": "j",
                "rules_file": "r",
                "playbook_dir": "p",
                "state_dir": "s",
                "budgets": {"max_nodes": 0},
            }
        )
    )
    with pytest.raises(RunnerConfigError, match=r"budgets\.max_nodes"):
        load_config(path, env={})
    path.write_text(yaml.safe_dump({"token_file": "t", "bogus": 1}))
    with pytest.raises(RunnerConfigError, match="bogus"):
        load_config(path, env={})


def test_play_vars_are_typed_and_template_free(tmp_path):
    base = {"token_file": "t", "journal_path": "j", "rules_file": "r", "playbook_dir": "p", "state_dir": "s"}
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump({**base, "play_vars": {"autoheal_slurm_conf": "/x"}}))
    assert load_config(path, env={}).play_vars == {"autoheal_slurm_conf": "/x"}
    for bad in ({"a": "{{ lookup('env','HOME') }}"}, {"autoheal_nodes": "x"}, {"a": {"b": 1}}):
        path.write_text(yaml.safe_dump({**base, "play_vars": bad}))
        with pytest.raises(RunnerConfigError, match="play_vars"):
            load_config(path, env={})


BASE = {"token_file": "t", "rules_file": "r", "playbook_dir": "p", "state_dir": "s"}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({}, "set exactly one of journal_path"),
        ({"journal_path": "j", "journal_dsn": "postgresql://a@h/db"}, "set exactly one of journal_path"),
        ({"journal_dsn": "postgresql://a:secret@h/db"}, "journal_dsn: carries a password"),
        ({"journal_dsn": "host=h dbname=db password=secret"}, "journal_dsn: carries a password"),
        (
            {
                "journal_dsn": "postgresql://a@h/db",
                "leader_election": {"enabled": True, "retry_period_seconds": 7},
            },
            "retry_period_seconds < renew_deadline_seconds",
        ),
        ({"journal_path": "j", "leader_election": {"namespace": "Bad_NS"}}, "leader_election.namespace"),
    ],
)
def test_journal_and_leader_election_errors_name_the_key_and_the_fix(tmp_path, extra, says):
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra}))
    with pytest.raises(RunnerConfigError, match=re.escape(says)) as err:
        load_config(path, env={})
    assert "secret" not in str(err.value)  # a password is never echoed back


def test_a_postgres_journal_and_leader_election_load(tmp_path):
    path = tmp_path / "runner.yaml"
    le = {"enabled": True, "identity": "r-0"}
    path.write_text(
        yaml.safe_dump({**BASE, "journal_dsn": "postgresql://autoheal@db:5432/j", "leader_election": le})
    )
    cfg = load_config(path, env={"AUTOHEAL_JOURNAL_DSN": "postgresql://autoheal@db2:5432/j"})
    assert cfg.journal_path is None and cfg.journal_dsn == "postgresql://autoheal@db2:5432/j"
    assert cfg.leader_election.enabled and cfg.leader_election.lease_duration_seconds == 8.0
