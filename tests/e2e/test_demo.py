"""The demo, short: a GPU dies during training and the job resumes by itself, end to end.

A lab of its own (tmp root, port base 25500, Kubernetes + runner, grace 30 s, provision delay 1 s),
one `lab.demo.trial`, then checks that the story really happened, in Slurm, in Kubernetes,
in the runner's journal and in the job's own progress, and that the report was written. While the
trial runs, a watcher thread records how the faulty node looked in Kubernetes: the runbook retires
it at the end (the pool deletes the Node object), so the quarantine can only be seen on the way.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from autoheal.labels import QUARANTINE_TAINT_KEY, QUARANTINED, REASON_PREFIX, SPARE_REASON, STATE_LABEL
from lab import demo, runner, slurm
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig
from tests.support import port_base

PORT_BASE = port_base(25500)

pytestmark = [pytest.mark.lab, pytest.mark.kube]


class NodeWatch(threading.Thread):
    """Polls every node's cordon / taint / label in the Kubernetes API until stopped."""

    def __init__(self, cfg: LabConfig) -> None:
        super().__init__(daemon=True)
        self.cfg = cfg
        self.stop_event = threading.Event()
        self.quarantined: dict[str, dict[str, Any]] = {}  # node -> first quarantined view
        self.errors: list[str] = []

    def run(self) -> None:
        from lab import controlplane

        with controlplane.http_client(self.cfg.kubeconfig, pool=2, timeout=5) as http:
            while not self.stop_event.is_set():
                try:
                    for n in http.get("/api/v1/nodes").json()["items"]:
                        name = n["metadata"]["name"]
                        spec = n.get("spec", {})
                        taints = {t["key"] for t in spec.get("taints") or []}
                        view = {
                            "unschedulable": bool(spec.get("unschedulable")),
                            "taint": QUARANTINE_TAINT_KEY in taints,
                            "label": n["metadata"].get("labels", {}).get(STATE_LABEL),
                            "ts": time.time(),
                        }
                        if view["unschedulable"] and view["taint"] and view["label"] == QUARANTINED:
                            self.quarantined.setdefault(name, view)
                except Exception as exc:  # the API may be busy; keep watching
                    self.errors.append(str(exc)[:200])
                self.stop_event.wait(0.3)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(10)


def test_demo_gpu_dies_and_job_resumes(tmp_path: Path) -> None:
    if not labmod.kube_available() or not labmod.runner_available():
        pytest.skip("the lab's Kubernetes tools or the runner are not built (scripts/build-tools.sh)")
    cfg = LabConfig(
        name="e2e",
        root=tmp_path / "labs",
        port_base=PORT_BASE,
        pools=[PoolConfig(size=4, spares=2, headroom=2)],
        kube=True,
        runner=True,
        grace_seconds=30,
        provision_delay=1,
    )
    quiet = Console(file=io.StringIO(), width=120)
    t0 = time.monotonic()
    watch: NodeWatch | None = None
    try:
        labmod.up(cfg)
        demo.check_healthy(cfg)
        spares_before = set(_spares(cfg))
        assert spares_before, "the lab should start with hot spares"
        watch = NodeWatch(cfg)
        watch.start()
        report = demo.trial(cfg, tmp_path / "demo", quiet, quiet, timeout=150, cleanup=True, live=False)
        watch.stop()
        node = report["faulty_node"]

        # the report
        assert Path(report["json"]).is_file() and Path(report["png"]).stat().st_size > 0
        assert json.loads(Path(report["json"]).read_text())["faulty_node"] == node
        seen = {p["phase"]: p["t_plus_s"] for p in report["phases"] if p["t_plus_s"] is not None}
        for phase in ("received", "fenced", "requeued", "job_running", "first_step"):
            assert phase in seen, f"phase {phase} missing from the report: {seen}"
        assert seen["received"] <= seen["fenced"] <= seen["job_running"] <= seen["first_step"]

        # Slurm: the faulty node is out of service, with the runbook's own reason; XID 79 is
        # RESTART_BM first (issue 15), so by now it may be back in the spare set, validated
        st = slurm.node_states(cfg)[node]
        assert {"DOWN", "DRAIN", "DRAINED"} & set(st["state"]), st
        assert st["reason"].startswith(REASON_PREFIX), st

        # Kubernetes: it was cordoned, tainted and labelled quarantined before it was retired
        assert node in watch.quarantined, f"{node} never seen quarantined (errors: {watch.errors[:3]})"
        assert watch.quarantined[node]["ts"] >= report["phases"][0]["ts"]

        # a spare was promoted: the journal says so, and a former spare is no longer a spare
        from remediation.journal import Journal

        j = Journal(runner.journal_path(cfg))
        try:
            phases = {e.phase: e.status for e in j.timeline(report["incident"])}
        finally:
            j.close()
        assert phases.get("spare_promoted") == "ok", phases
        assert phases.get("requeued") == "ok", phases
        assert spares_before - set(_spares(cfg)), "no spare left the spare set"

        # the job was requeued and resumed from its checkpoint, past its pre-fault step
        assert (
            report["nodes_after"]
            and node not in slurm.run(cfg, ["scontrol", "show", "hostnames", report["nodes_after"]]).split()
        )
        events = [
            json.loads(line)
            for line in (tmp_path / "demo" / "ckpt" / "progress.jsonl").read_text().splitlines()
            if line.strip()
        ]
        # the requeued run loaded the last checkpoint written before it started (the SIGTERM one when
        # the ranks got to write it in the grace period, else the last periodic one)
        restart = next(i for i, e in enumerate(events) if e["event"] == "start" and e["restart"] >= 1)
        ckpts = [e["step"] for e in events[:restart] if e["event"] == "checkpoint"]
        resumed = [e["step"] for e in events[restart:] if e["event"] == "first_step"]
        assert ckpts and resumed, f"no checkpoint before the requeue, or no resume: {events[-5:]}"
        assert events[restart]["step"] == ckpts[-1] > 0, "the requeued run did not load the last checkpoint"
        assert resumed[0] == ckpts[-1] + 1
        assert report["final_step"] > report["pre_fault_step"]

        # the job's owner was told, twice: hit, then resumed (issue 37)
        _check_owner_messages(report, node, ckpts[-1])
        # what the fault cost, checked against the incident's own timeline and the job's progress
        _check_cost(cfg, report, events[restart:], ckpts[-1])
        # every query of the dashboard returns data from the lab's real Prometheus
        _check_dashboard(cfg, report)
        assert time.monotonic() - t0 < 240, "the short demo must stay under 4 minutes"
    finally:
        if watch is not None:
            watch.stop()
        labmod.down(cfg)


def _spares(cfg: LabConfig) -> list[str]:
    return [
        n for n, s in slurm.node_states(cfg).items() if "DRAIN" in s["state"] and s["reason"] == SPARE_REASON
    ]


def _check_owner_messages(report: dict[str, Any], node: str, ckpt_step: int) -> None:
    job = int(report["job"])
    by_kind = {k: m for m in report["owner_messages"] for k in m["kinds"]}
    assert set(by_kind) == {"hit", "resumed"}, report["owner_messages"]
    assert len(report["owner_messages"]) == 2, "one message per piece of news, none twice"
    hit, resumed = by_kind["hit"], by_kind["resumed"]
    assert hit["jobs"] == [job] and hit["to"]["kind"] == "email"
    assert f"XID 79 (gpu-fatal) on GPU 3 on {node}: job(s) {job}" in hit["text"], hit["text"]
    assert "nothing is asked of you" in hit["text"]
    assert (
        f"Job {job} runs again on {report['nodes_after']} from checkpoint step {ckpt_step}, down "
        in (resumed["text"])
    ), resumed["text"]


def _check_cost(cfg: LabConfig, report: dict[str, Any], after: list[dict[str, Any]], ckpt_step: int) -> None:
    from remediation.journal import Journal

    (cost,) = report["cost"]["jobs"]
    j = Journal(runner.journal_path(cfg))
    try:
        inc = j.incident(report["incident"])
        starts = [a["starts_at"] for a in j.alerts(report["incident"])]
    finally:
        j.close()
    assert inc is not None and starts
    first_step = next(e["ts"] for e in after if e["event"] == "first_step")
    # the fault: the alert's startsAt (after the injection, before the runner opened the incident)
    assert cost["fault_ts"] == min(starts) <= inc.opened_at
    assert report["phases"][0]["ts"] - 1 <= cost["fault_ts"]
    assert cost["resumed_ts"] == first_step  # the job's own first step after the resume
    assert cost["down_s"] == pytest.approx(first_step - cost["fault_ts"])
    assert cost["gpus"] == 16 and cost["ckpt_step"] == ckpt_step  # 2 nodes x 8 GPUs
    assert cost["recompute_s"] is not None and cost["recompute_s"] >= 0
    hours = 16 * (cost["down_s"] + cost["recompute_s"]) / 3600
    assert cost["gpu_hours"] == pytest.approx(hours, abs=1e-6) == report["cost"]["gpu_hours"]
    for msg in report["owner_messages"]:  # shown with -s: what the researcher read
        print(f"owner message ({', '.join(msg['kinds'])}): {msg['text']}")
    print(f"cost: {report['cost_lines'][0]} (fault at the alert's startsAt, resumed at the job's first step)")


def _check_dashboard(cfg: LabConfig, report: dict[str, Any]) -> None:
    """Each panel's PromQL against the lab's Prometheus (which scrapes the runner): data for every
    one but the spare keeper's (off in this lab: its query must still be valid PromQL)."""
    import httpx

    from remediation import dashboard

    def results() -> dict[str, list[dict[str, Any]]]:
        out = {}
        for _title, expr, _needs in dashboard.queries():
            r = httpx.get(cfg.url("prometheus", "/api/v1/query"), params={"query": expr}, timeout=5).json()
            assert r["status"] == "success", (expr, r)
            out[expr] = r["data"]["result"]
        return out

    deadline = time.monotonic() + 20
    while True:
        got = results()
        empty = [e for _t, e, needs in dashboard.queries() if not needs and not got[e]]
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not empty, f"dashboard queries without data after the fault: {empty}"
    lost = got["sum by (pool, fault_class) (autoheal_gpu_hours_lost_total)"]
    assert float(lost[0]["value"][1]) == pytest.approx(
        report["cost"]["gpu_hours"], abs=1e-5
    )  # journal: 6 places
