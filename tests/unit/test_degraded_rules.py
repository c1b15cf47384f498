"""The degraded-node rules (issue 36) are rendered from the fault catalogue and pass promtool's
unit tests (monitoring/tests/degraded_rules_test.yml); a wrong rule makes those tests fail."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from autoheal.faults import Detector, load_fault_catalog
from autoheal.monitoring import render_alertmanager_config, render_degraded_rules, throttle_expr

MON = Path(__file__).resolve().parents[2] / "monitoring"


def _promtool(cwd: Path, test: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    assert tool, "promtool missing: scripts/bootstrap.sh installs it"
    return subprocess.run([tool, "test", "rules", test], cwd=cwd, capture_output=True, text=True)


def test_one_rule_per_metric_class_with_its_sustain_and_rung() -> None:
    cat = load_fault_catalog()
    [group] = render_degraded_rules()["groups"]
    want = {f.name.value: f for f in cat.by_detector(Detector.PROMETHEUS)}
    assert {r["labels"]["fault"] for r in group["rules"]} == set(want)
    for r in group["rules"]:
        f = want[r["labels"]["fault"]]
        assert r["alert"] == "NodeDegraded"
        assert r["for"] == f"{f.sustain_seconds}s"
        assert r["labels"]["tier"] == f.tier.value == "drain"


def test_throttle_reasons_are_tested_bit_by_bit() -> None:
    assert (
        throttle_expr("M", ["hw_thermal", "hw_slowdown"])
        == "(floor(M / 8) % 2 == 1) or (floor(M / 64) % 2 == 1)"
    )


def test_the_route_to_the_runner_takes_degraded_nodes_too() -> None:
    [route] = render_alertmanager_config("http://r/webhook", "/t")["route"]["routes"]
    assert route["matchers"] == ['alertname=~"GpuXidFatal|NodeDegraded"']


def test_promtool_unit_tests_pass() -> None:
    res = _promtool(MON, "tests/degraded_rules_test.yml")
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_fails_when_power_capping_would_drain_a_node(tmp_path: Path) -> None:
    # guard against a test that cannot fail: add sw_power_cap (0x4) and the shipped tests must break
    rules = render_degraded_rules()
    rule = next(r for r in rules["groups"][0]["rules"] if r["labels"]["fault"] == "gpu_throttle")
    rule["expr"] += " or " + throttle_expr("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", ["sw_power_cap"])
    (tmp_path / "degraded.rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "tests").mkdir()
    shutil.copy(MON / "tests" / "degraded_rules_test.yml", tmp_path / "tests")
    res = _promtool(tmp_path, "tests/degraded_rules_test.yml")
    assert res.returncode != 0
    assert "gpu-1" in res.stdout + res.stderr
