"""The simulator as the ladder sees it: reset clears a GPU's XID but not a GPU off the bus, a
reboot clears the node, the health check fails on any fault and on injected failures."""

from __future__ import annotations

import pytest

from lab.simulator import Fleet, LadderError, _faults


@pytest.fixture
def fleet() -> Fleet:
    f = Fleet(4)
    f.set_nodes({"gpu-1": "H100", "gpu-2": "H100"})
    return f


def test_health_reflects_faults_and_reset_clears_a_gpu(fleet):
    assert fleet.health("gpu-1")["healthy"]
    fleet.inject("gpu-1", 2, 48)
    h = fleet.health("gpu-1")
    assert not h["healthy"] and h["failures"] == ["GPU 2: XID 48"]
    assert fleet.reset("gpu-1", 2) == [2]
    assert fleet.health("gpu-1")["healthy"]
    assert fleet.health("gpu-2")["healthy"]


def test_a_gpu_off_the_bus_needs_a_reboot(fleet):
    fleet.inject("gpu-1", 3, 79)
    with pytest.raises(LadderError, match="not on the bus"):
        fleet.reset("gpu-1", None)
    fleet.inject("gpu-2", 1, 79, vanish=True)
    with pytest.raises(LadderError):
        fleet.reset("gpu-2", 1)
    fleet.reboot("gpu-1")
    fleet.reboot("gpu-2")
    assert fleet.health("gpu-1")["healthy"] and fleet.health("gpu-2")["healthy"]


def test_injected_failures_are_consumed_and_peek_consumes_nothing(fleet):
    fleet.faults("gpu-1", 2, "fail", None)
    assert fleet.health("gpu-1", peek=True)["healthy"]  # evidence reads, runs no check
    assert not fleet.health("gpu-1")["healthy"]
    assert not fleet.health("gpu-1")["healthy"]
    assert fleet.health("gpu-1")["healthy"]
    with pytest.raises(LadderError, match="injected"):
        fleet.reset("gpu-1", 0)
    assert [a["action"] for a in fleet.actions] == ["health", "health", "health"]


def test_fault_injection_input_is_validated_naming_the_field():
    assert _faults({"health_failures": 1, "reset": "hang"}) == (1, "hang", None)
    with pytest.raises(ValueError, match="health_failures"):
        _faults({"health_failures": -1})
    with pytest.raises(ValueError, match="reboot"):
        _faults({"reboot": "explode"})


def test_degraded_gpus_fail_the_diagnostics_a_flapping_link_does_not(tmp_path):
    """Issue 36: what a node drained for a degraded fault meets at its validation."""
    fleet = Fleet(4, kmsg_dir=tmp_path)
    fleet.set_nodes({"gpu-1": "H100", "gpu-2": "H100"})
    fleet.flap_link("gpu-1", 5)
    fleet.link_errors("gpu-1", 500)
    fleet.gpu_state("gpu-1", 0, 0x4 | 0x1, None)  # power capping, idle: no fault
    assert fleet.health("gpu-1")["failures"] == []

    fleet.gpu_state("gpu-1", 1, 0x40, None)  # HW thermal slowdown
    fleet.gpu_state("gpu-1", 2, None, True)
    fleet.pcie_width("gpu-1", 3, 8)
    assert fleet.health("gpu-1")["failures"] == [
        "GPU 1: clocks throttled (reasons 0x40)",
        "GPU 2: row remap pending",
        "GPU 3: PCIe link x8 of x16, 32 of 32 GT/s",
    ]
    assert fleet.health("gpu-2")["healthy"]
    fleet.reset("gpu-1", None)  # the pending remap applies; heat and the link stay
    assert [f[:5] for f in fleet.health("gpu-1")["failures"]] == ["GPU 1", "GPU 3"]
