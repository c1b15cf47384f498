"""The shipped monitoring files are generated from the catalogue and pass the real tools."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoheal.monitoring import render_alertmanager_config, render_xid_rules, shipped_files
from autoheal.xid import Tier, load_catalog

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "monitoring"


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_shipped_file_matches_the_catalogue(name):
    on_disk = yaml.safe_load((MON / name).read_text())
    assert on_disk == shipped_files()[name], f"monitoring/{name} drifted: run `autoheal monitoring render`"


def test_rule_expressions_name_exactly_the_acting_xids_and_unknown_ones_quarantine():
    rules = render_xid_rules()["groups"][0]["rules"]
    exprs = {r["labels"]["tier"]: r["expr"] for r in rules}
    listed, unknown = exprs["quarantine"].split(" or (DCGM_FI_DEV_XID_ERRORS > 0 unless (", 1)
    exprs["quarantine"] = listed
    by_tier = {t: {int(x) for x in re.findall(r"== (\d+)", e)} for t, e in exprs.items()}
    cat = load_catalog()
    acting = [t for t in Tier if t is not Tier.NOTIFY and cat.xids_of(t)]
    assert by_tier == {t.value: set(cat.xids_of(t)) for t in acting}
    # the fail-safe rule excludes every XID the catalogue knows, notify-only ones included
    assert {int(x) for x in re.findall(r"== (\d+)", unknown)} == {e.xid for e in cat.xids}


def test_alertmanager_route_sends_a_bearer_token_from_a_file():
    am = render_alertmanager_config("http://r/webhook", "/t/token")
    hook = am["receivers"][1]["webhook_configs"][0]
    assert hook["http_config"]["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/t/token",
    }
    assert am["route"]["routes"][0]["group_by"] == ["alertname", "Hostname"]


def _tool(name):
    path = shutil.which(name)
    assert path, f"{name} missing: scripts/bootstrap.sh installs it"
    return path


def test_promtool_unit_tests_pass():
    res = subprocess.run(
        [_tool("promtool"), "test", "rules", "tests/xid_rules_test.yml"],
        cwd=MON,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_check_config_passes():
    res = subprocess.run(
        [_tool("promtool"), "check", "config", "prometheus.yml"],
        cwd=MON,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_amtool_check_config_passes():
    res = subprocess.run(
        [_tool("amtool"), "check-config", "alertmanager.yml"],
        cwd=MON,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_unit_test_fails_when_an_application_xid_would_fire(tmp_path):
    # guard against a test that cannot fail: make 13 fatal and the shipped unit test must break
    rules = render_xid_rules()
    rules["groups"][0]["rules"][1]["expr"] += " or DCGM_FI_DEV_XID_ERRORS == 13"
    (tmp_path / "xid.rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "tests").mkdir()
    shutil.copy(MON / "tests" / "xid_rules_test.yml", tmp_path / "tests")
    res = subprocess.run(
        [_tool("promtool"), "test", "rules", "tests/xid_rules_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0
