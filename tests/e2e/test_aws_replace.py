"""XID 79 on an AWS-backed lab: the runbook reboots and then replaces the node through the AWS API,
and the Auto Scaling group's replacement joins Slurm as a hot spare.

The lab (tmp root, port base 28300, KWOK nodes with host slurmds, 2 active + 1 spare) runs its
pool as an EKS managed node group in moto, a server process (lab.aws): every node's
`spec.providerID` is an instance of the group, and the runner's plays reach "AWS" through the
lab's endpoint with the AWS backend (pools/aws.py). The node's GPU keeps failing its validation
after the reboot (a ladder fault), so the ladder climbs to replace:

    XID 79 -> fenced -> spare promoted, job requeued -> RebootInstances (new boot id) ->
    validation fails -> TerminateInstanceInAutoScalingGroup (desired capacity kept) ->
    the group launches an instance -> the bridge makes it a node, drained "joining" ->
    the runner's spare keeper makes it the pool's spare

Checked in moto (the instance terminated, the group's desired capacity unchanged, the new node's
providerID is the group's new instance), in Slurm, in Kubernetes and in the runner's journal; the
phase table is printed (pytest -s shows it). Then a second fault whose replacement never becomes a
node (the pool's headroom is spent): the run waits its replacement timeout, fails once, and the
node stays fenced.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from autoheal.labels import JOINING_REASON, SPARE_LABEL, SPARE_REASON, SPARE_STATE, STATE_LABEL
from lab import aws, controlplane, ladder, runner, slurm
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from tests.support import port_base, processes_pointing_into, wait_for

PORT_BASE = port_base(28300)
VICTIM = "gpu-1"
NEW_NODE = "gpu-4"  # the pool's first headroom name (size 2 + 1 spare)

pytestmark = [pytest.mark.lab, pytest.mark.kube]


def _nodes(cfg: LabConfig) -> dict[str, dict[str, Any]]:
    with controlplane.http_client(cfg.kubeconfig, pool=1, timeout=10) as http:
        return {n["metadata"]["name"]: n for n in http.get("/api/v1/nodes").json()["items"]}


def _pool_events(cfg: LabConfig) -> list[dict[str, Any]]:
    path = cfg.run_dir / "pool" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _event_ts(cfg: LabConfig, event: str, node: str) -> float | None:
    return next((e["ts"] for e in _pool_events(cfg) if e["event"] == event and e["node"] == node), None)


def _timeline(cfg: LabConfig, node: str) -> tuple[str, dict[str, tuple[str, float]]]:
    """The node's incident and its phases ({phase: (status, first ts)})."""
    from remediation.journal import Journal

    j = Journal(runner.journal_path(cfg))
    try:
        inc = [i for i in j.incidents() if i.node == node][-1]
        phases: dict[str, tuple[str, float]] = {}
        for e in j.timeline(inc.id):
            phases.setdefault(e.phase, (e.status, e.ts))
        return inc.id, phases
    finally:
        j.close()


class SpareWatch:
    """When the new node was first seen joining (Slurm: drained JOINING_REASON) and first seen a
    spare (Slurm: drained SPARE_REASON; Kubernetes: state=spare, spare label)."""

    def __init__(self, cfg: LabConfig) -> None:
        self.cfg = cfg
        self.joining: float | None = None
        self.spare: float | None = None

    def poll(self) -> bool:
        s = slurm.node_states(self.cfg).get(NEW_NODE)
        if s and "DRAIN" in s["state"] and s["reason"] == JOINING_REASON and self.joining is None:
            self.joining = time.time()
        node = _nodes(self.cfg).get(NEW_NODE)
        labels = (node or {}).get("metadata", {}).get("labels", {})
        if (
            s
            and s["reason"] == SPARE_REASON
            and labels.get(STATE_LABEL) == SPARE_STATE
            and labels.get(SPARE_LABEL) == "true"
        ):
            self.spare = self.spare or time.time()
            return True
        return False


def test_xid79_replaces_the_node_through_aws_and_the_replacement_joins_as_a_spare(tmp_path: Path) -> None:
    if not labmod.kube_available() or not labmod.runner_available():
        pytest.skip("the lab's Kubernetes tools or the runner are not built (scripts/build-tools.sh)")
    cfg = LabConfig(
        name="aws-e2e",
        root=tmp_path / "labs",
        port_base=PORT_BASE,
        # one headroom name: the second fault's replacement finds no room (its act below)
        pools=[PoolConfig(size=2, spares=1, headroom=1, backend="aws")],
        grace_seconds=10,
        provision_delay=1,
    )
    try:
        labmod.up(cfg)
        ec2, asg = aws.clients(aws.endpoint(cfg))
        group = aws.group_name(cfg, cfg.pools[0])
        before = aws.group_state(asg, group)
        ids = {n: k["spec"].get("providerID", "") for n, k in _nodes(cfg).items()}
        assert {aws.instance_of(p) for p in ids.values()} == set(before.in_service), ids
        rows = {s.name: s for s in labmod.status(cfg).services}
        assert rows["pool/h100"].healthy and "desired 3, 3 InService" in rows["pool/h100"].detail
        victim_instance = aws.instance_of(ids[VICTIM])

        # a job on both active nodes: the fault requeues it, and it runs again on the promoted spare
        job = slurm.run(
            cfg,
            [
                "sbatch",
                "--parsable",
                "--requeue",
                "-N",
                "2",
                "-o",
                str(tmp_path / "job.out"),
                "--wrap",
                "sleep 600",
            ],
        ).strip()
        wait_for(lambda: _job(cfg, job)[0] == "RUNNING", 30, "the job running")
        assert VICTIM in _job(cfg, job)[1]

        ladder.faults(cfg, VICTIM, health_failures=1)  # the reboot does not fix it: replace
        t_fault = time.time()
        labmod.inject(cfg, VICTIM, 0, 79)
        watch = SpareWatch(cfg)
        try:
            wait_for(
                watch.poll, 240, f"{NEW_NODE} a spare (the group's replacement, kept by the spare keeper)"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_diagnosis(cfg)}") from None

        # AWS: the victim's instance terminated in its group, desired capacity kept, and the
        # group's new instance is the new node's
        state = ec2.describe_instances(InstanceIds=[victim_instance])["Reservations"][0]["Instances"][0]
        assert state["State"]["Name"] == "terminated"
        after = aws.group_state(asg, group)
        assert after.desired == before.desired == 3 and len(after.in_service) == 3, after
        (new_instance,) = set(after.in_service) - set(before.in_service)
        nodes = _nodes(cfg)
        assert VICTIM not in nodes
        assert aws.instance_of(nodes[NEW_NODE]["spec"]["providerID"]) == new_instance

        # the runbook: fenced, spare promoted, job requeued, rebooted through RebootInstances,
        # validation failed, retired through the AWS API (journalled once the play's wait for the
        # group's replacement returned)
        wait_for(lambda: "retired" in _timeline(cfg, VICTIM)[1], 60, "the retirement journalled")
        incident, phases = _timeline(cfg, VICTIM)
        for phase in ("fenced", "spare_promoted", "requeued", "rebooted", "retired"):
            assert phases.get(phase, ("missing",))[0] == "ok", (phase, phases)
        assert phases["validated"][0] == "failed", phases
        assert _event_ts(cfg, "rebooted", VICTIM), "the lab's AWS never rebooted the node"
        wait_for(
            lambda: _job(cfg, job)[0] == "RUNNING" and VICTIM not in _job(cfg, job)[1], 60, "the job again"
        )

        launched = _event_ts(cfg, "instance_launched", NEW_NODE)
        registered = _event_ts(cfg, "replacement_ready", NEW_NODE)
        assert watch.joining is not None, f"{NEW_NODE} was never seen drained {JOINING_REASON!r}"
        assert launched and registered and watch.spare
        table = [
            ("XID 79 injected", t_fault),
            ("fenced", phases["fenced"][1]),
            ("spare promoted", phases["spare_promoted"][1]),
            ("requeued", phases["requeued"][1]),
            ("rebooted (RebootInstances)", phases["rebooted"][1]),
            ("retired (TerminateInstanceInAutoScalingGroup)", phases["retired"][1]),
            ("instance launched (bridge saw it)", launched),
            ("node registered (Slurm, drained joining)", registered),
            ("spare (spare keeper)", watch.spare),
        ]
        print(f"\nAWS-backed lab, incident {incident}: phase, seconds after the fault")
        for name, ts in table:
            print(f"  {name:<48} {ts - t_fault:7.1f}")
        # promotion and requeue run side by side; every other phase follows the one before
        t = dict(table)
        assert t["XID 79 injected"] < t["fenced"] < min(t["spare promoted"], t["requeued"])
        assert max(t["spare promoted"], t["requeued"]) < t["rebooted (RebootInstances)"], table
        # the journal records the retirement once the call returned; the group launched meanwhile
        assert t["rebooted (RebootInstances)"] < t["instance launched (bridge saw it)"], table
        tail = [ts for _, ts in table[-3:]]
        assert tail == sorted(tail), table

        _replacement_never_comes(cfg, asg, group)
    finally:
        labmod.down(cfg)
    # moto's server, the bridge and its endpoint went with the lab
    assert not processes_pointing_into(cfg.run_dir, cfg.socket_dir)


def _replacement_never_comes(cfg: LabConfig, asg: Any, group: str) -> None:
    """The second fault's replacement never becomes a node (the pool's headroom is spent: the group
    launches an instance the bridge has no name for): the runbook waits its replacement timeout,
    the incident fails once with why, and the node stays fenced in Slurm."""
    second = "gpu-2"
    # one incident at a time (the lab's budget): the first one's run must be over, or this fault
    # trips the breaker and waits for a human
    wait_for(lambda: _closed(cfg, VICTIM), 120, f"{VICTIM}'s incident to close")
    ladder.faults(cfg, second, health_failures=1)
    labmod.inject(cfg, second, 0, 79)

    def closed() -> str | None:
        try:
            _, phases = _timeline(cfg, second)
        except IndexError:  # no incident yet: the alert is on its way
            return None
        return phases.get("recover_failed", (None,))[0] or phases.get("escalated", (None,))[0]

    try:
        wait_for(closed, 300, f"{second}'s incident to fail (no replacement)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_diagnosis(cfg, second)}") from None
    from remediation.journal import Journal

    j = Journal(runner.journal_path(cfg))
    try:
        iid = [i for i in j.incidents() if i.node == second][-1].id

        def failed() -> bool:
            inc = j.incident(iid)
            return inc is not None and inc.state == "failed"

        wait_for(failed, 60, "the incident closed failed")
        failures = [t for t in j.timeline(iid) if t.phase == "recover_failed"]
    finally:
        j.close()
    assert len(failures) == 1, failures  # escalated once
    assert "retire failed, kept fenced" in failures[0].detail and "replacement" in failures[0].detail, (
        failures
    )
    # the instance is gone (terminated in its group), the group has launched its replacement, and
    # Slurm keeps the node fenced with the runbook's reason until a human acts
    assert any(e["event"] == "headroom_exhausted" for e in _pool_events(cfg))
    assert len(aws.group_state(asg, group).in_service) == 3
    state, _, reason = (
        slurm.run(cfg, ["sinfo", "-h", "-N", "-n", second, "-o", "%T|%E"]).strip().partition("|")
    )
    assert state.startswith(("drain", "down")) and reason.startswith("autoheal:"), (state, reason)


def _closed(cfg: LabConfig, node: str) -> bool:
    from remediation.journal import Journal

    j = Journal(runner.journal_path(cfg))
    try:
        return all(not i.is_open for i in j.incidents() if i.node == node)
    finally:
        j.close()


def _diagnosis(cfg: LabConfig, node: str = VICTIM) -> str:
    """What the journal, the pool's events and the runner's log say (a failure's context)."""
    from lab import procs

    try:
        incident, phases = _timeline(cfg, node)
    except Exception as exc:
        incident, phases = f"? ({exc})", {}
    events = [(e["event"], e["node"], e.get("error", "")) for e in _pool_events(cfg)]
    log = procs.log_tail(procs.log_path(cfg.run_dir, "runner"), 40, "\n")
    return f"incident {incident}: {phases}\npool events: {events}\nrunner log:\n{log}"


def _job(cfg: LabConfig, job: str) -> tuple[str, list[str]]:
    """(state, nodes) of a job."""
    out = slurm.run(cfg, ["squeue", "-h", "-j", job, "-o", "%T %N"]).split()
    if not out:
        return "", []
    nodes = slurm.run(cfg, ["scontrol", "show", "hostnames", out[1]]).split() if len(out) > 1 else []
    return out[0], nodes
