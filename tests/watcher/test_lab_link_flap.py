"""A flapping link in the lab, end to end (issue 36): the simulator flaps a node's InfiniBand port
(its sysfs link_downed counter), the node's real watcher posts NodeDegraded to the lab's real
Alertmanager, the real runner routes it to playbooks/gpu_degraded.yml, and the lab's real Slurm
DRAINs the node while its job keeps RUNNING; the job ends on its own, the runner's degraded-return
loop sees the node idle and runs playbooks/degraded_return.yml: validated (the simulator's health
check) and returned to service, or, where the GPU is still sick, escalated to quarantine.
One flap below the threshold does nothing. The metric classes (GPU throttling, a pending row
remap, a straggler) go through the lab's real Prometheus and the degraded rules instead of the
watcher. Every class runs a job on its node and prints fault -> DRAINING (job RUNNING) and job
end -> node validated (returned, or quarantined)."""

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
        [inc] = [i for i in j.incidents() if i.node == name and i.source != "return"]
        timeline = j.timeline(inc.id)
        facts = next((e.detail for e in timeline if e.phase == "alert_facts"), "")
        return inc, [e.phase for e in timeline], facts
    finally:
        j.close()


def start_job(lab: LabConfig, name: str, tmp: Path) -> tuple[int, Path]:
    """A job on `name` that runs until its stop file appears, then ends on its own (COMPLETED)."""
    stop = tmp / f"stop-{name}"
    script = tmp / f"job-{name}.sh"
    script.write_text(f"#!/bin/sh\nwhile [ ! -e {stop} ]; do sleep 0.2; done\nexit 0\n")
    script.chmod(0o755)
    out = slurm(lab, "sbatch", "--parsable", "-w", name, "-N1", "-o", "/dev/null", str(script))
    job = int(out.split(";")[0])
    wait_for(lambda: job_state(lab, job) == "RUNNING", 60, f"the job on {name} running")
    return job, stop


def draining_with_job(lab: LabConfig, name: str, job: int) -> None:
    """DRAIN, not DOWN: the node still runs its job, which was not signalled, killed or requeued."""
    n = node(lab, name)
    assert n["reason"].startswith("autoheal: degraded drain inc-"), n["reason"]
    assert base_state(n) in ("ALLOCATED", "MIXED") and "DOWN" not in n["state_flags"], n
    assert job_state(lab, job) == "RUNNING"


def returned(lab: LabConfig, name: str) -> bool:
    n = node(lab, name)
    return "DRAIN" not in n["state_flags"] and base_state(n) == "IDLE" and n["reason"] == ""


def quarantined(lab: LabConfig, name: str) -> bool:
    n = node(lab, name)
    return "DRAIN" in n["state_flags"] and str(n["reason"]).startswith("autoheal: degraded quarantine")


def job_end_to_validated(lab: LabConfig, name: str, job: int, stop: Path, outcome: str) -> float:
    """End the job; seconds until the node is validated and returned (or escalated to
    quarantine), with the return incident's journal checked."""
    from lab import runner
    from remediation.journal import Journal

    t0 = time.monotonic()
    stop.touch()
    wait_for(lambda: job_state(lab, job) in ("COMPLETED", "GONE"), 60, f"the job on {name} ending")
    done = returned if outcome == "returned" else quarantined
    wait_for(lambda: done(lab, name), 90, f"{name} {outcome}")
    took = time.monotonic() - t0
    j = Journal(runner.journal_path(lab))
    try:
        [ret] = [i for i in j.incidents() if i.node == name and i.source == "return"]
        wait_for(lambda: not j.require_incident(ret.id).is_open, 30, "the return incident closed")
        ret = j.require_incident(ret.id)
        phases = {(e.phase, e.status) for e in j.timeline(ret.id)}
    finally:
        j.close()
    assert ret.playbook == "degraded_return.yml"
    if outcome == "returned":
        assert ret.state.value == "completed" and {("validated", "ok"), ("returned", "ok")} <= phases
    else:
        assert ret.state.value == "failed" and {("validated", "failed"), ("quarantined", "ok")} <= phases
    return took


def test_a_flapping_link_drains_the_node_the_job_runs_to_its_end_and_the_node_returns(
    lab: LabConfig, tmp_path: Path
) -> None:
    threshold = load_fault_catalog().require(FaultClass.LINK_FLAP).threshold
    job, stop = start_job(lab, NODE, tmp_path)
    try:
        time.sleep(1.5)  # the watcher has learnt the port's counters

        sim(lab, "/v1/link", {"node": NODE, "flaps": 1})  # one flap: below the threshold
        time.sleep(3.0)
        assert degraded_alerts(lab) == []
        assert "DRAIN" not in node(lab, NODE)["state_flags"]

        t0 = time.monotonic()
        sim(lab, "/v1/link", {"node": NODE, "flaps": threshold - 1})
        wait_for(lambda: "DRAIN" in node(lab, NODE)["state_flags"], 60, "the node DRAINING")
        to_draining = time.monotonic() - t0
        draining_with_job(lab, NODE, job)
        [alert] = degraded_alerts(lab)
        assert (alert["labels"]["Hostname"], alert["labels"]["fault"]) == (NODE, "link_flap")
        for other in ("gpu-1", "gpu-3"):
            assert "DRAIN" not in node(lab, other)["state_flags"]
        time.sleep(3.0)
        assert job_state(lab, job) == "RUNNING"  # and stays running after the play ended
        assert not [i for i in incidents(lab) if i.source == "return"]  # nothing validates a busy node

        inc, phases, facts = incident_of(lab, NODE)
        assert (inc.tier, inc.playbook, inc.state) == ("drain", "gpu_degraded.yml", "completed")
        assert {"fenced", "done"} <= set(phases) and '"fault": "link_flap"' in facts

        to_returned = job_end_to_validated(lab, NODE, job, stop, "returned")
        # the return is copied onto the drain incident by the loop's next pass (the new-fault boundary)
        wait_for(lambda: "returned" in incident_of(lab, NODE)[1], 10, "the return on the drain incident")
        assert "validation_queued" in incident_of(lab, NODE)[1]
        print(
            f"\nlink flap -> DRAINING (job RUNNING): {to_draining:.2f}s;"
            f" job end -> validated and returned: {to_returned:.2f}s"
        )
    finally:
        stop.touch()


def incidents(lab: LabConfig) -> list[Any]:
    from lab import runner
    from remediation.journal import Journal

    j = Journal(runner.journal_path(lab))
    try:
        return j.incidents()
    finally:
        j.close()


def test_a_gpu_whose_pcie_link_trained_down_is_drained_once_it_held_and_quarantined_after_its_job(
    lab: LabConfig, tmp_path: Path
) -> None:
    sustain = load_fault_catalog().require(FaultClass.PCIE_DOWNTRAINED).sustain_seconds
    job, stop = start_job(lab, "gpu-3", tmp_path)
    try:
        t0 = time.monotonic()
        sim(lab, "/v1/pcie", {"node": "gpu-3", "gpu": 1, "width": 8})
        wait_for(lambda: "DRAIN" in node(lab, "gpu-3")["state_flags"], sustain + 60, "gpu-3 DRAINING")
        took = time.monotonic() - t0
        assert took >= sustain
        draining_with_job(lab, "gpu-3", job)
        inc, _phases, facts = incident_of(lab, "gpu-3")
        assert inc.tier == "drain" and '"fault": "pcie_downtrained"' in facts
        # still x8 at the validation: DCGM's PCIe test fails it, the node climbs to quarantine
        to_validated = job_end_to_validated(lab, "gpu-3", job, stop, "quarantined")
        print(
            f"\nPCIe x8 of x16 -> DRAINING (job RUNNING): {took:.2f}s (sustain {sustain}s);"
            f" job end -> validation failed, quarantined: {to_validated:.2f}s"
        )
    finally:
        stop.touch()


def test_dcgm_throttling_for_heat_and_a_pending_row_remap_drain_power_capping_does_not(
    lab: LabConfig, tmp_path: Path
) -> None:
    """The metric classes: the simulator's DCGM series, the lab's real Prometheus with the
    degraded rules (their sustain cut to lab.prom.LAB_SUSTAIN_S), the same route and runner.
    After the job: a GPU still hot fails its validation (quarantine); a pending remap is applied
    by the GPU reset before the validation, and the node returns."""
    from lab.prom import LAB_SUSTAIN_S

    job, stop = start_job(lab, "gpu-4", tmp_path)
    try:
        sim(
            lab, "/v1/gpu_state", {"node": "gpu-1", "gpu": 0, "throttle_reasons": 0x4 | 0x1}
        )  # power cap, idle
        t0 = time.monotonic()
        sim(lab, "/v1/gpu_state", {"node": "gpu-4", "gpu": 2, "throttle_reasons": 0x40})  # HW thermal
        wait_for(lambda: "DRAIN" in node(lab, "gpu-4")["state_flags"], 60, "gpu-4 DRAINING")
        took = time.monotonic() - t0
        draining_with_job(lab, "gpu-4", job)
        inc, _phases, facts = incident_of(lab, "gpu-4")
        assert inc.tier == "drain" and '"fault": "gpu_throttle"' in facts and '"source": "dcgm"' in facts
        to_validated = job_end_to_validated(lab, "gpu-4", job, stop, "quarantined")
        assert "DRAIN" not in node(lab, "gpu-1")["state_flags"]  # power capping is no fault
        print(
            f"\nHW thermal slowdown -> DRAINING (job RUNNING): {took:.2f}s (sustain {LAB_SUSTAIN_S}s);"
            f" job end -> validation failed, quarantined: {to_validated:.2f}s"
        )
    finally:
        stop.touch()

    sim(lab, "/v1/clear", {"node": "gpu-1"})
    job, stop = start_job(lab, "gpu-1", tmp_path)
    try:
        t0 = time.monotonic()
        sim(lab, "/v1/gpu_state", {"node": "gpu-1", "gpu": 3, "row_remap_pending": True})
        wait_for(lambda: "DRAIN" in node(lab, "gpu-1")["state_flags"], 60, "gpu-1 DRAINING")
        took = time.monotonic() - t0
        draining_with_job(lab, "gpu-1", job)
        inc, _phases, facts = incident_of(lab, "gpu-1")
        assert inc.tier == "drain" and '"fault": "row_remap_pending"' in facts
        to_validated = job_end_to_validated(lab, "gpu-1", job, stop, "returned")
        print(
            f"row remap pending -> DRAINING (job RUNNING): {took:.2f}s;"
            f" job end -> GPU reset, validated and returned: {to_validated:.2f}s"
        )
    finally:
        stop.touch()


def test_a_rank_slower_than_its_peers_drains_its_node(lab: LabConfig, tmp_path: Path) -> None:
    """The straggler rule on the ranks' step times (the simulator stands for the job's exporter):
    the slow rank's node is drained (as the promtool tests show, within the margin is no fault);
    once the job ends the node itself passes its validation and returns."""
    job, stop = start_job(lab, "gpu-5", tmp_path)
    try:
        times = {"gpu-1": 1.0, "gpu-2": 1.02, "gpu-3": 0.99, "gpu-5": 1.6}
        t0 = time.monotonic()
        for rank, (name, seconds) in enumerate(times.items()):
            sim(lab, "/v1/step", {"node": name, "slurm_job": "77", "rank": rank, "seconds": seconds})
        wait_for(lambda: "DRAIN" in node(lab, "gpu-5")["state_flags"], 60, "gpu-5 DRAINING")
        took = time.monotonic() - t0
        draining_with_job(lab, "gpu-5", job)
        inc, _phases, facts = incident_of(lab, "gpu-5")
        assert inc.tier == "drain" and '"fault": "straggler"' in facts and '"source": "job"' in facts
        to_validated = job_end_to_validated(lab, "gpu-5", job, stop, "returned")
        print(
            f"\nstraggler (1.6 s vs a median of ~1.0 s) -> DRAINING (job RUNNING): {took:.2f}s;"
            f" job end -> validated and returned: {to_validated:.2f}s"
        )
    finally:
        stop.touch()


def test_climbing_symbol_errors_drain_the_node_a_few_do_not(lab: LabConfig, tmp_path: Path) -> None:
    threshold = load_fault_catalog().require(FaultClass.NIC_ERRORS).threshold
    job, stop = start_job(lab, "gpu-6", tmp_path)
    try:
        sim(lab, "/v1/link", {"node": "gpu-6", "errors": threshold // 10})
        time.sleep(3.0)
        assert "DRAIN" not in node(lab, "gpu-6")["state_flags"]
        t0 = time.monotonic()
        sim(lab, "/v1/link", {"node": "gpu-6", "errors": threshold})
        wait_for(lambda: "DRAIN" in node(lab, "gpu-6")["state_flags"], 60, "gpu-6 DRAINING")
        took = time.monotonic() - t0
        draining_with_job(lab, "gpu-6", job)
        inc, _phases, facts = incident_of(lab, "gpu-6")
        assert inc.tier == "drain" and '"fault": "nic_errors"' in facts
        to_validated = job_end_to_validated(lab, "gpu-6", job, stop, "returned")
        print(
            f"\nsymbol errors -> DRAINING (job RUNNING): {took:.2f}s;"
            f" job end -> validated and returned: {to_validated:.2f}s"
        )
    finally:
        stop.touch()


def test_mlx5_link_lines_in_the_kernel_log_are_link_flaps(lab: LabConfig) -> None:
    """The kernel log's own words (watcher/link_lines.py): mlx5e's "Link down" for the node's IPoIB
    interface, as many times as the threshold, drain the node like the counters do; then, idle,
    it is validated and returned. gpu-2's earlier flaps were counted on mlx5_0/1 (sysfs): these
    are a port of their own (kmsg/ib0), a new fault after its return."""
    threshold = load_fault_catalog().require(FaultClass.LINK_FLAP).threshold
    wait_for(lambda: returned(lab, NODE), 60, f"{NODE} back from the first test")
    line = "mlx5_core 0000:3b:00.0 ib0: Link down"
    sim(lab, "/v1/kmsg", {"node": NODE, "message": line})
    time.sleep(3.0)
    assert "DRAIN" not in node(lab, NODE)["state_flags"]  # one line: below the threshold
    t0 = time.monotonic()
    for _ in range(threshold - 1):
        sim(lab, "/v1/kmsg", {"node": NODE, "message": line})
    wait_for(lambda: "DRAIN" in node(lab, NODE)["state_flags"], 60, f"{NODE} DRAINED")
    took = time.monotonic() - t0
    alerts = [a for a in degraded_alerts(lab) if a["labels"]["Hostname"] == NODE]
    assert "kmsg/ib0" in {a["labels"]["device"] for a in alerts}
    wait_for(lambda: returned(lab, NODE), 60, f"{NODE} validated and returned")
    print(f"\nmlx5 'Link down' x{threshold} in the kernel log -> DRAINED: {took:.2f}s, then returned")


def test_a_whole_leaf_switch_flapping_is_one_incident_not_a_drain_of_the_rack(lab: LabConfig) -> None:
    """Last in the module: the runner restarts knowing the lab's topology (gpu-1, gpu-5 and the
    spare gpu-7 under leaf-1: a static map, as a cluster without topology labels has). The
    simulator flaps leaf-1: every node's watcher alerts, and the runner opens one incident for
    the switch - one page - and drains none of them (tests/remediation/test_rem_domains.py: the
    rest of the table)."""
    from lab import procs, runner

    leaf = ["gpu-1", "gpu-5", "gpu-7"]
    procs.stop(lab.run_dir, lab.runner_services[0])
    runner.start(
        lab,
        {"failure_domains": {"label": "", "nodes": dict.fromkeys(leaf, "leaf-1"), "hold_seconds": 3}},
    )
    before = {n: (node(lab, n)["state_flags"], node(lab, n)["reason"]) for n in leaf}
    t0, since = time.monotonic(), time.time()
    threshold = load_fault_catalog().require(FaultClass.LINK_FLAP).threshold
    sim(lab, "/v1/switch", {"nodes": leaf, "flaps": threshold})

    def domain_incident() -> list[Any]:  # (gpu-1 and gpu-5 have closed incidents of other faults)
        return [
            i
            for i in incidents(lab)
            if i.node in leaf and i.fault_class == "degraded" and i.opened_at >= since
        ]

    wait_for(
        lambda: len(domain_incident()) == 3 and all(i.state.value == "notified" for i in domain_incident()),
        60,
        "one incident for leaf-1",
    )
    took = time.monotonic() - t0
    incs = domain_incident()
    [lead] = [i for i in incs if i.reason.startswith("failure domain leaf-1:")]
    assert "3 nodes with link_flap/nic_errors" in lead.reason and "no node drained" in lead.reason
    assert all(i.tier == "notify" for i in incs)
    time.sleep(2.0)
    assert {n: (node(lab, n)["state_flags"], node(lab, n)["reason"]) for n in leaf} == before  # none drained
    print(f"\nleaf switch of 3 nodes flapping -> one incident for the switch, no drain: {took:.2f}s")
