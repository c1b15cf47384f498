"""The burst scenario's pieces without a lab (lab/burst.py, issue 35): the stack switch that turns
the runner pod's lender on, the demo's autoscaler, the load generator against a real HTTP server,
and the reading of Slurm's answers. tests/nodes/test_burst_service.py runs the inference service
on real kubelets; the whole story runs in `autoheal lab demo --scenario burst`."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from autoheal.errors import LabError
from components.runner import RemediationRunnerArgs, runner_settings
from lab import burst, stack
from lab.config import LabConfig, PoolConfig
from remediation.config import parse_config

# --- the stack switch ---------------------------------------------------------------------------


def _pods_runner_settings(cfg: LabConfig, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from lab.nodes import cluster

    monkeypatch.setattr(
        cluster, "context", lambda run_dir: SimpleNamespace(net=SimpleNamespace(gateway="10.250.0.1"))
    )
    slurm: dict[str, Any] = {}
    runner: dict[str, Any] = {}
    stack._pods_config(cfg, slurm, runner, {})
    settings: dict[str, Any] = runner["settings"]
    return settings


def test_the_burst_lab_turns_the_runner_pods_lender_on_with_the_demos_timers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = burst.lab_config("b-unit", 22800, tmp_path)
    settings = _pods_runner_settings(cfg, monkeypatch)
    assert settings["lending"] == {**burst.LENDING, "enabled": True}
    # what the runner pod reads: the component's config file, parsed as `autoheal serve` parses it
    conf = runner_settings(RemediationRunnerArgs(settings=settings, event_namespace="audit"))
    parsed = parse_config(conf, "runner.yaml", tmp_path, {})
    assert parsed.lending.enabled and parsed.lending.event_namespace == "audit"
    assert parsed.lending.cooldown_seconds == 20 and parsed.lending.return_after_seconds == 10
    assert parsed.lending.priority_class == burst.PRIORITY_CLASS
    # a pods lab without lending leaves the runner's default (off)
    plain = LabConfig(name="b-plain", root=tmp_path, slurm="pods", pools=[PoolConfig(size=2, spares=0)])
    assert "lending" not in _pods_runner_settings(plain, monkeypatch)


def test_lending_needs_a_pods_lab_and_settings_the_runner_accepts(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match=r"lending: the lender runs in the stack's runner pod; set slurm: pods"
    ):
        LabConfig(name="b-host", root=tmp_path, lending={"max_nodes": 1})
    with pytest.raises(ValidationError, match=r"lending: cooldown_secs: Extra inputs are not permitted"):
        LabConfig(name="b-bad", root=tmp_path, slurm="pods", lending={"cooldown_secs": 5})
    with pytest.raises(
        ValidationError, match=r"lending: max_percent: Input should be less than or equal to 100"
    ):
        LabConfig(name="b-bad", root=tmp_path, slurm="pods", lending={"max_percent": 150})


# --- the autoscaler -------------------------------------------------------------------------------


def test_the_autoscaler_scales_up_at_once_and_down_only_after_the_stabilization() -> None:
    a = burst.Autoscaler(per_pod_rps=10, max_replicas=2, down_after=3)
    assert a.desired(0) == 0 and a.desired(0.5) == 1 and a.desired(10) == 1 and a.desired(10.01) == 2
    assert a.desired(1000) == 2  # the lendable capacity caps it
    assert a.decide(0.0, 20) == 2
    assert a.decide(1.0, 20) is None  # no change, nothing to do
    assert a.decide(2.0, 0) is None  # the load fell: held ...
    assert a.decide(4.0, 0) is None
    assert a.decide(4.5, 20) is None  # ... and back before the window closed: nothing dropped
    assert a.replicas == 2
    assert a.decide(5.0, 5) is None  # a new window starts here
    assert a.decide(7.9, 5) is None
    assert a.decide(8.1, 5) == 1  # 3 s of wanting fewer: down to what it wants now
    assert a.decide(8.2, 0) is None
    assert a.decide(11.3, 0) == 0
    assert a.decide(11.4, 12) == 2  # up again at once


def test_the_autoscaler_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="per_pod_rps"):
        burst.Autoscaler(per_pod_rps=0, max_replicas=2)
    with pytest.raises(ValueError, match="min_replicas/max_replicas"):
        burst.Autoscaler(per_pod_rps=1, max_replicas=1, min_replicas=2)
    with pytest.raises(ValueError, match="down_after"):
        burst.Autoscaler(per_pod_rps=1, max_replicas=1, down_after=-1)
    assert burst.Autoscaler(per_pod_rps=5, max_replicas=3, min_replicas=1).desired(0) == 1


# --- the load generator -----------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, str]]]:
    """The inference server's answer, from a local HTTP server whose 'node' can be changed."""
    who = {"node": "", "pod": "infer-1"}

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not who["node"]:
                self.send_error(503)
                return
            body = json.dumps(who).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/", who
    finally:
        srv.shutdown()
        srv.server_close()


def test_the_load_generator_sends_at_its_rate_and_finds_the_first_answer_of_a_node(
    server: tuple[str, dict[str, str]],
) -> None:
    url, who = server
    load = burst.LoadGenerator(url, timeout=1.0).start()
    try:
        time.sleep(0.5)
        assert load.answers == []  # rate 0: nothing sent
        t0 = time.time()
        load.rate = 20
        time.sleep(1.0)
        failed = load.since(t0)
        assert failed and not any(a.ok for a in failed)  # nothing serves yet (503)
        who["node"] = "gpu-2"
        t_serving = time.time()
        time.sleep(1.0)
        load.rate = 0
        time.sleep(0.3)
        answers = load.since(t0)
        n = len(answers)
        time.sleep(0.5)
        assert len(load.since(t0)) == n  # stopped sending at rate 0
    finally:
        load.stop()
    assert 25 <= n <= 45, n  # ~20/s for ~2 s
    first = burst.first_served(answers, "gpu-2", t0)
    assert first is not None and first.node == "gpu-2" and first.pod == "infer-1"
    assert first.ts >= t_serving - 0.2  # no answer counted before the node served
    assert burst.first_served(answers, "gpu-1", t0) is None
    assert all(a.ok for a in answers if a.ts > first.ts)


# --- Slurm's answers --------------------------------------------------------------------------


def test_slurm_states_drop_the_flag_suffixes_and_jobs_read_their_nodes() -> None:
    def sinfo(argv: list[str]) -> str:
        assert argv[0] == "sinfo"
        return "gpu-1 alloc\ngpu-2 idle*\ngpu-3 drain$\nbad\n"

    states = burst.slurm_states(sinfo)
    assert states == {"gpu-1": "alloc", "gpu-2": "idle", "gpu-3": "drain"}
    assert [n for n, s in states.items() if s in burst.SCHEDULABLE] == ["gpu-1", "gpu-2"]
    assert burst.job_where(lambda argv: "RUNNING gpu-2\n", "7") == ("RUNNING", "gpu-2")
    assert burst.job_where(lambda argv: "PENDING \n", "7") == ("PENDING", "")
    assert burst.job_where(lambda argv: "", "7") == ("", "")


def test_the_example_jobs_progress_gives_its_last_step(tmp_path: Path) -> None:
    p = tmp_path / "progress.jsonl"
    assert burst.training_step(None) == 0 and burst.training_step(p) == 0
    p.write_text(
        '{"event": "start", "step": 0}\n{"event": "first_step", "step": 1}\n'
        '{"event": "step", "step": 7}\n{"event": "checkpoint", "step": 20}\n{"partial'
    )
    assert burst.training_step(p) == 7


# --- one burst's bookkeeping, against a scripted cluster -----------------------------------------


class _World:
    """A cluster that answers the scenario as the real one would, one step per observation: the
    Deployment's pods Pending, then the lender's journal lines and labels (lend, lent), the pods
    Running on gpu-2 and answering; at 0 replicas the return, then slurmd registering."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.replicas = 0
        self.side = "training"
        self.in_slurm = True
        self.steps = 0
        self.answers: list[burst.Answer] = []

    def _lender(self, action: str, side: str) -> None:
        with self.journal.open("a") as f:
            f.write(json.dumps({"ts": time.time(), "node": "gpu-2", "action": action}) + "\n")
        self.side = side

    def advance(self) -> None:
        self.steps += 1
        if self.replicas and self.side == "training" and self.steps > 2:
            self._lender("lend", "lending")
            self.in_slurm = False
        elif self.replicas and self.side == "lending":
            self._lender("lent", "lent")
        elif self.replicas and self.side == "lent":
            self.answers.append(burst.Answer(time.time(), True, "gpu-2", "infer-a"))
        elif not self.replicas and self.side == "lent":
            self._lender("return", "returning")
        elif self.side == "returning":
            self._lender("returned", "training")
        elif self.side == "training" and not self.in_slurm:
            self.in_slurm = True


class _Kube:
    def __init__(self, world: _World) -> None:
        self.w = world

    def scale(self, replicas: int) -> None:
        self.w.replicas = replicas

    def pods(self) -> list[dict[str, Any]]:
        self.w.advance()
        lent = self.w.side == "lent"
        phase, node = ("Running", "gpu-2") if lent else ("Pending", "")
        return [{"status": {"phase": phase}, "spec": {"nodeName": node}}] * self.w.replicas

    def sides(self, pool: str) -> dict[str, str]:
        return {"gpu-1": "training", "gpu-2": self.w.side}


class _Load(burst.LoadGenerator):
    def __init__(self, world: _World) -> None:
        super().__init__("http://unused/")
        self.w = world

    def since(self, t: float) -> list[burst.Answer]:
        return [a for a in self.w.answers if a.ts >= t]


def test_one_burst_is_watched_from_the_load_to_the_node_back_in_slurm(tmp_path: Path) -> None:
    w = _World(tmp_path / "lending.jsonl")

    def slurm(argv: list[str]) -> str:
        if argv[0] == "sinfo":
            return "gpu-1 alloc\n" + ("gpu-2 idle\n" if w.in_slurm else "")
        return "RUNNING gpu-2" if w.in_slurm and w.side == "training" else "PENDING "

    sc = burst.Scenario(
        _Kube(w),  # type: ignore[arg-type]
        slurm,
        _Load(w),
        burst.Autoscaler(10, max_replicas=2, down_after=0.3),
        "h100",
        w.journal,
        hold_s=0.3,
    )
    b = sc.burst(timeout=30, on_lent=lambda b: "42")
    assert b.node == "gpu-2" and b.queued_job == "42"
    order = [k for k, _, ts in sorted(b.rows(), key=lambda r: r[2] or 0) if ts is not None]
    assert set(order) == {k for k, _ in burst.PHASES}, order
    for before, after in [
        ("burst", "scaled_up"),
        ("scaled_up", "pending"),
        ("pending", "lending"),
        ("lending", "lent"),
        ("lent", "first_served"),
        ("first_served", "burst_over"),
        ("burst_over", "scaled_down"),
        ("scaled_down", "returning"),
        ("returning", "returned"),
        ("returned", "in_slurm"),
        ("in_slurm", "training"),
    ]:
        assert b.seen[before] <= b.seen[after], (before, after, b.seen)
    figs = b.figures()
    assert figs["burst_to_first_served_s"] == pytest.approx(b.seen["first_served"] - b.t0, abs=0.01)
    assert figs["burst_over_to_in_slurm_s"] is not None and figs["burst_over_to_in_slurm_s"] > 0.3
    assert sc.load.rate == 0 and sc.scaler.replicas == 0 and w.replicas == 0
    # the report names the phases in order with their times after the burst
    report = burst._report(b, sc.load, tmp_path / "r")
    assert [p["phase"] for p in report["phases"]] == [k for k, _ in burst.PHASES]
    assert report["requests"]["served_on_lent_node"] == report["requests"]["served"] > 0
    assert json.loads(Path(report["json"]).read_text())["lent_node"] == "gpu-2"


def test_a_burst_nobody_lends_for_ends_in_an_error_naming_what_it_waited_for(tmp_path: Path) -> None:
    w = _World(tmp_path / "lending.jsonl")
    w.steps = -(10**9)  # the lender never acts
    sc = burst.Scenario(
        _Kube(w),  # type: ignore[arg-type]
        lambda argv: "",
        _Load(w),
        burst.Autoscaler(10, max_replicas=2),
        "h100",
        w.journal,
    )
    with pytest.raises(LabError, match=r"not over after 1s; waiting for: node lending .*none lent"):
        sc.burst(timeout=1.0)
    assert sc.load.rate == 0  # the load stops either way
