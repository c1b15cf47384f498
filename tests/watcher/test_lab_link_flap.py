"""A flapping link in the lab, end to end (issue 36): the simulator flaps a node's InfiniBand port
(its sysfs link_downed counter), the node's real watcher posts NodeDegraded to the lab's real
Alertmanager, the real runner routes it to playbooks/gpu_degraded.yml, and the lab's real Slurm
DRAINs the node while its job keeps RUNNING; the job ends on its own and the node is DRAINED.
One flap below the threshold does nothing. Prints fault -> DRAINING and job end -> DRAINED.
The metric classes (GPU throttling, a pending row remap, a straggler) go through the lab's real
Prometheus and the degraded rules instead of the watcher."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoheal.faults import FaultClass, load_fault_catalog
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from tests.support import lab_slurm, port_base, wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(400)]
PORT_BASE = port_base(22600)
NODE = "gpu-2"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabConfig]:
    cfg = LabConfig(
        name="linkflap",
        root=tmp_path_factory.mktemp("flaplabs"),
        port_base=PORT_BASE,
        pools=[PoolConfig(size=6, spares=1, headroom=1)],
        kube=False,
        runner=True,
        grace_seconds=30,
        provision_delay=1,
    )
    try:
        labmod.up(cfg)
        yield cfg
    finally:
        labmod.down(cfg)


def slurm(lab: LabConfig, *argv: str) -> str:
    return lab_slurm(lab, *argv)


def node(lab: LabConfig, name: str) -> dict[str, Any]:
    [n] = [n for n in json.loads(slurm(lab, "sinfo", "--json"))["nodes"] if n["name"] == name]
    return dict(n)


def base_state(n: dict[str, Any]) -> str:
    s = n["state"]
    return str(s[0] if isinstance(s, list) else s).upper()


def job_state(lab: LabConfig, job: int) -> str:
    jobs = {j["job_id"]: j for j in json.loads(slurm(lab, "squeue", "--json"))["jobs"]}
    if job not in jobs:
        return "GONE"
    s = jobs[job]["job_state"]
    return str(s[0] if isinstance(s, list) else s)


def sim(lab: LabConfig, path: str, body: dict[str, Any]) -> None:
    r = httpx.post(lab.url("simulator", path), json=body, timeout=5)
    assert r.status_code == 200, r.text


def degraded_alerts(lab: LabConfig) -> list[dict[str, Any]]:
    alerts = httpx.get(lab.url("alertmanager", "/api/v2/alerts"), timeout=5).json()
    return [a for a in alerts if a["labels"].get("alertname") == "NodeDegraded"]


def incident_of(lab: LabConfig, name: str) -> tuple[Any, list[str], str]:
    """The node's incident in the runner's journal, its phases and its alert facts."""
    from lab import runner
    from remediation.journal import Journal

    j = Journal(runner.journal_path(lab))
    try:
        [inc] = [i for i in j.incidents() if i.node == name]
        timeline = j.timeline(inc.id)
        facts = next((e.detail for e in timeline if e.phase == "alert_facts"), "")
        return inc, [e.phase for e in timeline], facts
    finally:
        j.close()


def test_a_flapping_link_drains_the_node_and_the_job_runs_to_its_end(lab: LabConfig, tmp_path: Path) -> None:
    threshold = load_fault_catalog().require(FaultClass.LINK_FLAP).threshold
    stop = tmp_path / "stop"
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\nwhile [ ! -e {stop} ]; do sleep 0.2; done\nexit 0\n")
    script.chmod(0o755)
    job = int(
        slurm(lab, "sbatch", "--parsable", "-w", NODE, "-N1", "-o", "/dev/null", str(script)).split(";")[0]
    )
    try:
        wait_for(lambda: job_state(lab, job) == "RUNNING", 60, "the job running")
        time.sleep(1.5)  # the watcher has learnt the port's counters

        sim(lab, "/v1/link", {"node": NODE, "flaps": 1})  # one flap: below the threshold
        time.sleep(3.0)
        assert degraded_alerts(lab) == []
        assert "DRAIN" not in node(lab, NODE)["state_flags"]

        t0 = time.monotonic()
        sim(lab, "/v1/link", {"node": NODE, "flaps": threshold - 1})
        wait_for(lambda: "DRAIN" in node(lab, NODE)["state_flags"], 60, "the node DRAINING")
        to_draining = time.monotonic() - t0
        n = node(lab, NODE)
        assert n["reason"].startswith("autoheal: degraded drain inc-"), n["reason"]
        assert base_state(n) in ("ALLOCATED", "MIXED") and "DOWN" not in n["state_flags"]
        assert job_state(lab, job) == "RUNNING"  # nothing signalled, killed or requeued
        [alert] = degraded_alerts(lab)
        assert (alert["labels"]["Hostname"], alert["labels"]["fault"]) == (NODE, "link_flap")
        for other in ("gpu-1", "gpu-3"):
            assert "DRAIN" not in node(lab, other)["state_flags"]
        time.sleep(3.0)
        assert job_state(lab, job) == "RUNNING"  # and stays running after the play ended

        inc, phases, facts = incident_of(lab, NODE)
        assert (inc.tier, inc.playbook, inc.state) == ("drain", "gpu_degraded.yml", "completed")
        assert {"fenced", "done"} <= set(phases) and '"fault": "link_flap"' in facts

        t1 = time.monotonic()
        stop.touch()
        wait_for(lambda: job_state(lab, job) in ("COMPLETED", "GONE"), 60, "the job's end")
        wait_for(lambda: base_state(node(lab, NODE)) == "IDLE", 60, "the node DRAINED")
        to_drained = time.monotonic() - t1
        n = node(lab, NODE)
        assert "DRAIN" in n["state_flags"] and n["reason"].startswith("autoheal: degraded drain")
        print(
            f"\nlink flap -> DRAINING (job RUNNING): {to_draining:.2f}s; job end -> DRAINED: {to_drained:.2f}s"
        )
    finally:
        stop.touch()


def test_a_gpu_whose_pcie_link_trained_down_is_drained_once_it_held(lab: LabConfig) -> None:
    sustain = load_fault_catalog().require(FaultClass.PCIE_DOWNTRAINED).sustain_seconds
    t0 = time.monotonic()
    sim(lab, "/v1/pcie", {"node": "gpu-3", "gpu": 1, "width": 8})
    wait_for(lambda: "DRAIN" in node(lab, "gpu-3")["state_flags"], sustain + 60, "gpu-3 DRAINED")
    took = time.monotonic() - t0
    assert took >= sustain
    assert node(lab, "gpu-3")["reason"].startswith("autoheal: degraded drain inc-")
    inc, _phases, facts = incident_of(lab, "gpu-3")
    assert inc.tier == "drain" and '"fault": "pcie_downtrained"' in facts
    print(f"\nPCIe x8 of x16 -> DRAINED: {took:.2f}s (sustain {sustain}s)")


def test_dcgm_throttling_for_heat_and_a_pending_row_remap_drain_power_capping_does_not(
    lab: LabConfig,
) -> None:
    """The metric classes: the simulator's DCGM series, the lab's real Prometheus with the
    degraded rules (their sustain cut to lab.prom.LAB_SUSTAIN_S), the same route and runner."""
    from lab.prom import LAB_SUSTAIN_S

    sim(lab, "/v1/gpu_state", {"node": "gpu-1", "gpu": 0, "throttle_reasons": 0x4 | 0x1})  # power cap, idle
    t0 = time.monotonic()
    sim(lab, "/v1/gpu_state", {"node": "gpu-4", "gpu": 2, "throttle_reasons": 0x40})  # HW thermal
    wait_for(lambda: "DRAIN" in node(lab, "gpu-4")["state_flags"], 60, "gpu-4 DRAINED")
    took = time.monotonic() - t0
    inc, _phases, facts = incident_of(lab, "gpu-4")
    assert inc.tier == "drain" and '"fault": "gpu_throttle"' in facts and '"source": "dcgm"' in facts
    time.sleep(LAB_SUSTAIN_S + 3)
    assert "DRAIN" not in node(lab, "gpu-1")["state_flags"]  # power capping is no fault
    print(f"\nHW thermal slowdown -> DRAINED: {took:.2f}s (sustain {LAB_SUSTAIN_S}s)")

    sim(lab, "/v1/clear", {"node": "gpu-1"})
    t0 = time.monotonic()
    sim(lab, "/v1/gpu_state", {"node": "gpu-1", "gpu": 3, "row_remap_pending": True})
    wait_for(lambda: "DRAIN" in node(lab, "gpu-1")["state_flags"], 60, "gpu-1 DRAINED")
    inc, _phases, facts = incident_of(lab, "gpu-1")
    assert inc.tier == "drain" and '"fault": "row_remap_pending"' in facts
    print(f"row remap pending -> DRAINED: {time.monotonic() - t0:.2f}s")


def test_a_rank_slower_than_its_peers_drains_its_node(lab: LabConfig) -> None:
    """The straggler rule on the ranks' step times (the simulator stands for the job's exporter):
    the slow rank's node is drained (as the promtool tests show, within the margin is no fault)."""
    times = {"gpu-1": 1.0, "gpu-2": 1.02, "gpu-3": 0.99, "gpu-5": 1.6}
    t0 = time.monotonic()
    for rank, (name, seconds) in enumerate(times.items()):
        sim(lab, "/v1/step", {"node": name, "slurm_job": "77", "rank": rank, "seconds": seconds})
    wait_for(lambda: "DRAIN" in node(lab, "gpu-5")["state_flags"], 60, "gpu-5 DRAINED")
    inc, _phases, facts = incident_of(lab, "gpu-5")
    assert inc.tier == "drain" and '"fault": "straggler"' in facts and '"source": "job"' in facts
    print(f"\nstraggler (1.6 s vs a median of ~1.0 s) -> DRAINED: {time.monotonic() - t0:.2f}s")


def test_climbing_symbol_errors_drain_the_node_a_few_do_not(lab: LabConfig) -> None:
    threshold = load_fault_catalog().require(FaultClass.NIC_ERRORS).threshold
    sim(lab, "/v1/link", {"node": "gpu-6", "errors": threshold // 10})
    time.sleep(3.0)
    assert "DRAIN" not in node(lab, "gpu-6")["state_flags"]
    t0 = time.monotonic()
    sim(lab, "/v1/link", {"node": "gpu-6", "errors": threshold})
    wait_for(lambda: "DRAIN" in node(lab, "gpu-6")["state_flags"], 60, "gpu-6 DRAINED")
    inc, _phases, facts = incident_of(lab, "gpu-6")
    assert inc.tier == "drain" and '"fault": "nic_errors"' in facts
    print(f"\nsymbol errors -> DRAINED: {time.monotonic() - t0:.2f}s")
