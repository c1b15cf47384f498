"""The shipped monitoring files are generated from the catalogue and pass the real tools."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from autoheal.monitoring import (
    XID_METRIC,
    render_alertmanager_config,
    render_xid_rules,
    shipped_files,
    xid_expr,
    xid_ranges,
)
from autoheal.xid import Tier, load_catalog

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "monitoring"


@pytest.mark.parametrize("name", sorted(shipped_files()))
def test_shipped_file_matches_the_catalogue(name):
    on_disk = yaml.safe_load((MON / name).read_text())
    assert on_disk == shipped_files()[name], f"monitoring/{name} drifted: run `autoheal monitoring render`"


def test_consecutive_xids_are_one_range_and_single_ones_a_comparison():
    assert xid_ranges([7, 1, 3, 2, 9, 10, 3]) == [(1, 3), (7, 7), (9, 10)]
    assert xid_expr([1, 2, 3, 7], metric="m") == "(m >= 1 <= 3) or m == 7"


def test_every_xid_value_fires_exactly_its_catalogue_tier(tmp_path):
    """promtool evaluates the rendered rules for every XID value from 1 to past the catalogue's
    last (one GPU each): an acting XID fires once with its tier, a notify-only one never, an XID
    the catalogue does not know fires as quarantine."""
    cat = load_catalog()
    values = range(1, max(e.xid for e in cat.xids) + 4)
    series, expected = [], []
    for x in values:
        labels = {"Hostname": "n", "gpu": str(x)}
        series.append({"series": f'{XID_METRIC}{{Hostname="n",gpu="{x}"}}', "values": f"{x} {x}"})
        tier = cat.tier_of(x)
        if tier is not Tier.NOTIFY:
            expected.append(
                {
                    "exp_labels": {
                        **labels,
                        "severity": "critical",
                        "tier": tier.value,
                        "xid": str(x),
                        "source": "dcgm",
                    },
                    "exp_annotations": {
                        "summary": f"Fatal XID {x} on n GPU {x}",
                        "catalog_version": str(cat.version),
                    },
                }
            )
    assert any(cat.tier_of(x) is Tier.NOTIFY for x in values) and any(cat.get(x) is None for x in values)
    (tmp_path / "xid.rules.yml").write_text(yaml.safe_dump(render_xid_rules()))
    test = {
        "rule_files": ["xid.rules.yml"],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": series,
                "alert_rule_test": [{"eval_time": "1s", "alertname": "GpuXidFatal", "exp_alerts": expected}],
            }
        ],
    }
    (tmp_path / "every_xid_test.yml").write_text(yaml.safe_dump(test))
    res = subprocess.run(
        [_tool("promtool"), "test", "rules", "every_xid_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


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
