"""The degraded-fault catalogue (issue 36): the shipped file loads, every class is there with the
gentle rung, and bad entries are refused with the field named."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from autoheal.errors import ConfigError
from autoheal.faults import (
    DETECTOR_OF,
    Detector,
    FaultClass,
    load_fault_catalog,
    parse_fault_catalog,
)
from autoheal.xid import Tier


def _raw() -> dict[str, Any]:
    from importlib import resources

    return yaml.safe_load(resources.files("autoheal.data").joinpath("fault_catalog.yaml").read_text())


def test_every_class_is_catalogued_on_the_drain_rung_with_its_detector() -> None:
    cat = load_fault_catalog()
    assert {f.name for f in cat.faults} == set(FaultClass)
    for f in cat.faults:
        assert f.tier is Tier.DRAIN, f.name
        assert f.detector is DETECTOR_OF[f.name]
    assert [f.name for f in cat.by_detector(Detector.WATCHER)] == [
        FaultClass.LINK_FLAP,
        FaultClass.NIC_ERRORS,
        FaultClass.PCIE_DOWNTRAINED,
    ]
    assert cat.require(FaultClass.GPU_THROTTLE).throttle_mask == 0x8 | 0x20 | 0x40 | 0x80
    assert cat.escalation.repeats >= 2


def test_drain_is_gentler_than_a_reset_and_climbs_to_quarantine() -> None:
    assert Tier.RESTART_APP.rank < Tier.DRAIN.rank < Tier.RESET.rank
    assert Tier.DRAIN.fences
    assert Tier.DRAIN.next_rung() is Tier.QUARANTINE


def test_alert_text_naming_an_unknown_class_finds_nothing() -> None:
    cat = load_fault_catalog()
    assert cat.get("link_flap") is not None
    for hostile in ("", "LINK_FLAP", "link_flap ", "../x", "xid79"):
        assert cat.get(hostile) is None


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        (("faults", 0, "threshold"), 0, "faults.0.threshold"),
        (("faults", 0, "window_seconds"), -5, "faults.0.window_seconds"),
        (("faults", 1, "tier"), "reboot", "faults.1.tier"),
        (("faults", 2, "name"), "cosmic_ray", "faults.2.name"),
        (("faults", 3, "reasons"), ["hot"], "faults.3.reasons"),
        (("faults", 4, "metric"), "bad metric{}", "faults.4.metric"),
        (("faults", 0, "detector"), "prometheus", "detector: link_flap is detected by watcher"),
        (("faults", 5, "margin_percent"), None, "margin_percent: straggler needs"),
        (("faults", 0, "colour"), "red", "faults.0.colour"),
        (("escalation", "repeats"), 0, "escalation.repeats"),
        (("version",), 0, "version"),
    ],
)
def test_a_bad_entry_is_refused_with_its_field_named(path: tuple[Any, ...], value: Any, named: str) -> None:
    raw = copy.deepcopy(_raw())
    node: Any = raw
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(ConfigError) as err:
        parse_fault_catalog(raw, "x.yaml")
    assert "x.yaml" in str(err.value)
    assert named in str(err.value)


def test_a_class_listed_twice_is_refused() -> None:
    raw = _raw()
    raw["faults"].append(dict(raw["faults"][0]))
    with pytest.raises(ConfigError, match="link_flap is listed twice"):
        parse_fault_catalog(raw)
