"""Job owners told what a fault did to their jobs, and what it cost (remediation/owner_loop.py).

A real journal (SQLite) and real HTTP sinks on loopback (one that can be down or answer 503);
Slurm's side is a table of jobs here (the lab's real Slurm is read in tests/e2e/test_demo.py).
Each test drives the loop's passes by hand with its own clock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from remediation.config import NotifySink, OwnerSettings
from remediation.cost import COST_PHASE, costs_from, incident_cost
from remediation.errors import RunnerConfigError
from remediation.journal import Journal
from remediation.metrics import Metrics
from remediation.notify import Notifier
from remediation.owner_loop import NOTICE_PHASE, OwnerLoop, SinkDown
from remediation.owners import Contact, OwnerDirectory
from remediation.slurm_jobs import JobInfo, parse_job, pool_gpus_of
from remediation.states import IncidentState
from tests.remediation.remhelp import free_port, open_incident

T0 = 1_800_000_000.0  # the fault


class Inbox:
    """An HTTP receiver on loopback that records JSON posts; `status` 503 plays a sink in trouble."""

    def __init__(self, port: int = 0) -> None:
        self.posts: list[dict[str, Any]] = []
        self.status = 200
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if inbox.status == 200:
                    inbox.posts.append(json.loads(body))
                self.send_response(inbox.status)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/owners"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Jobs:
    """Slurm's answer for each job id."""

    table: dict[int, JobInfo] = field(default_factory=dict)
    gpus: int = 48

    def jobs(self, ids: Any) -> dict[int, JobInfo]:
        return {i: self.table[i] for i in ids if i in self.table}

    def pool_gpus(self, pool: str) -> int:
        return self.gpus if pool == "h100" else 0


def job(job_id: int, user: str, state: str = "PENDING", **kw: Any) -> JobInfo:
    base = JobInfo(job_id, user, state, "", 16, 1, None, "", "", "batch", "None")
    return replace(base, **kw)


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    box = Inbox()
    yield box
    box.close()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite")
    yield j
    j.close()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_loop(
    journal: Journal,
    url: str,
    jobs: Jobs,
    clock: Clock,
    directory: dict[str, Contact] | None = None,
    on_call: Notifier | None = None,
    **settings: Any,
) -> OwnerLoop:
    s = OwnerSettings(
        sink=NotifySink.model_validate({"url": url, "retries": 1, "timeout_seconds": 2}), **settings
    )
    notifier = on_call or Notifier((), Metrics(), backoff=0.01)
    notifier.backoff = 0.01
    return OwnerLoop(
        s,
        journal,
        notifier.metrics or Metrics(),
        notifier,
        jobs,
        OwnerDirectory(
            directory if directory is not None else {"alice": Contact("email", "alice@example.org")}
        ),
        lambda nodes: {n: "h100" for n in nodes},
        clock=clock,
    )


def requeue(journal: Journal, node: str, jobs: list[int], at: float = T0 + 5) -> str:
    """An incident on `node` whose play requeued `jobs`."""
    with journal.transaction(now=T0 + 1) as tx:
        iid = open_incident(tx, node=node, state=IncidentState.ADMITTED)
        tx.add_alert(
            fingerprint=node, starts_at=T0, status="firing", alertname="GpuXid", labels={}, outcome="incident"
        )
        tx.conn.execute("UPDATE alerts SET incident_id=? WHERE fingerprint=?", (iid, node))
        ids = ",".join(map(str, jobs))
        tx.timeline(iid, "requeued", "ok", source="play", ts=at, detail=f"requeued {ids}")
    return iid


def close(journal: Journal, iid: str, reason: str = "replaced", at: float = T0 + 30) -> None:
    with journal.transaction(now=at) as tx:
        tx.transition(iid, IncidentState.RUNNING, "")
        tx.transition(iid, IncidentState.COMPLETED, reason)


def told(journal: Journal, iid: str) -> list[str]:
    return [e.detail for e in journal.timeline(iid) if e.phase == NOTICE_PHASE]


def test_a_storm_gives_each_owner_one_message(journal: Journal, inbox: Inbox) -> None:
    """Three nodes fail; alice has jobs on all three, bob on one: one message each, held while the
    storm still brings news, and every (incident, job) journalled once."""
    incs = [
        requeue(journal, "gpu-1", [11, 12]),
        requeue(journal, "gpu-2", [13]),
        requeue(journal, "gpu-3", [21]),
    ]
    jobs = Jobs(
        {i: job(i, "alice") for i in (11, 12, 13)} | {21: job(21, "bob", mail_user="bob@example.org")}
    )
    clock = Clock(T0 + 6)  # one second after the requeues: the storm may not be over
    loop = make_loop(journal, inbox.url, jobs, clock)
    assert loop.reconcile() == 0 and inbox.posts == []
    clock.now = T0 + 9
    assert loop.reconcile() == 2
    by_user = {p["user"]: p for p in inbox.posts}
    assert by_user["alice"]["jobs"] == [11, 12, 13] and by_user["alice"]["kinds"] == ["hit"]
    assert by_user["alice"]["to"] == {"kind": "email", "address": "alice@example.org"}
    assert by_user["bob"]["to"] == {"kind": "email", "address": "bob@example.org"}  # his MailUser
    text = by_user["alice"]["text"]
    assert "XID 79 (gpu-fatal) on GPU 0 on gpu-1: job(s) 11, 12" in text and "gpu-2: job(s) 13" in text
    assert "nothing is asked of you" in text
    assert told(journal, incs[0]) == [
        "hit job 11 alice -> email:alice@example.org",
        "hit job 12 alice -> email:alice@example.org",
    ]
    assert loop.reconcile() == 0 and len(inbox.posts) == 2  # nothing twice


def test_an_owner_of_a_hundred_jobs_gets_one_message(journal: Journal, inbox: Inbox) -> None:
    incs = [requeue(journal, f"gpu-{n}", [100 + n]) for n in range(100)]
    jobs = Jobs({100 + n: job(100 + n, "alice") for n in range(100)})
    loop = make_loop(journal, inbox.url, jobs, Clock(T0 + 60))
    assert loop.reconcile() == 1
    (post,) = inbox.posts
    assert len(post["jobs"]) == 100 and len(post["incidents"]) == 100
    assert "and 50 more" in post["text"]  # the text lists 50; the payload has all
    assert all(len(told(journal, i)) == 1 for i in incs)


def test_no_contact_goes_to_on_call_once(journal: Journal, inbox: Inbox) -> None:
    on_call_box = Inbox()
    try:
        on_call = Notifier(
            (NotifySink.model_validate({"url": f"http://127.0.0.1:{on_call_box.port}/"}),),
            Metrics(),
            backoff=0.01,
        )
        on_call.start()
        iid = requeue(journal, "gpu-1", [31, 32])
        loop = make_loop(
            journal,
            inbox.url,
            Jobs({31: job(31, "carol"), 32: job(32, "carol")}),
            Clock(T0 + 60),
            on_call=on_call,
        )
        assert loop.reconcile() == 0 and loop.reconcile() == 0
        on_call.stop()
        (page,) = on_call_box.posts
        assert page["event"] == "job.owner_unknown"
        assert "user carol: job(s) 31, 32" in page["reason"]
        assert inbox.posts == []
        assert told(journal, iid) == [
            "hit job 31 carol -> on-call (no contact)",
            "hit job 32 carol -> on-call (no contact)",
        ]
    finally:
        on_call_box.close()


def test_a_sink_that_is_down_gets_it_later_once(journal: Journal, inbox: Inbox) -> None:
    """503 after the retries: nothing journalled, the pass fails (the loop backs off); the sink
    back: sent once; a new loop on the same journal (a restarted runner) sends nothing again."""
    iid = requeue(journal, "gpu-1", [41])
    jobs = Jobs({41: job(41, "alice")})
    inbox.status = 503
    loop = make_loop(journal, inbox.url, jobs, Clock(T0 + 60))
    with pytest.raises(SinkDown):
        loop.reconcile()
    assert told(journal, iid) == [] and inbox.posts == []
    inbox.status = 200
    assert loop.reconcile() == 1 and len(inbox.posts) == 1
    assert make_loop(journal, inbox.url, jobs, Clock(T0 + 70)).reconcile() == 0
    assert len(inbox.posts) == 1


def test_a_closed_port_is_a_sink_down_too(journal: Journal) -> None:
    requeue(journal, "gpu-1", [42])
    loop = make_loop(
        journal, f"http://127.0.0.1:{free_port()}/", Jobs({42: job(42, "alice")}), Clock(T0 + 60)
    )
    with pytest.raises(SinkDown):
        loop.reconcile()


def progress_file(path: Path) -> Path:
    """What examples/train.py writes: steps every 10 at 0.1 s/step, a periodic checkpoint at 100,
    the fault at T0, half a second after step 150, the restart loading checkpoint 100 (no SIGTERM one)."""
    ev: list[dict[str, Any]] = [{"ts": T0 - 20.0, "event": "start", "step": 0, "restart": 0}]
    for step in range(10, 151, 10):
        ev.append({"ts": T0 - 15.5 + step * 0.1, "event": "step", "step": step})
        if step == 100:
            ev.append({"ts": T0 - 15.5 + 10.0, "event": "checkpoint", "step": 100, "reason": "periodic"})
    ev.append({"ts": T0 + 40.0, "event": "start", "step": 100, "restart": 1})
    ev.append({"ts": T0 + 42.5, "event": "first_step", "step": 101, "restart": 1})
    path.write_text("".join(json.dumps(e) + "\n" for e in ev))
    return path


def test_resumed_message_and_its_cost(journal: Journal, inbox: Inbox, tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    progress = progress_file(tmp_path / "ckpt" / "progress.jsonl")
    iid = requeue(journal, "gpu-1", [51])
    close(journal, iid)
    jobs = Jobs({51: job(51, "alice")})
    clock = Clock(T0 + 20)
    loop = make_loop(journal, inbox.url, jobs, clock, progress_roots=(tmp_path,))
    assert loop.reconcile() == 1  # the hit
    jobs.table[51] = job(
        51, "alice", "RUNNING", nodes="gpu-[5-6]", start_ts=T0 + 38, comment=f"progress={progress}"
    )
    clock.now = T0 + 50
    assert loop.reconcile() == 1
    resumed = inbox.posts[1]
    assert resumed["kinds"] == ["resumed"]
    assert "Job 51 runs again on gpu-[5-6] from checkpoint step 100, down 42 s." in resumed["text"]
    (cost,) = costs_from(journal.timeline(iid))
    # checked against its own timeline: the fault (alert startsAt) at T0, the first step at T0 + 42.5,
    # steps 100 -> 150 had taken 5 s before the fault; 16 GPUs
    assert (cost.fault_ts, cost.resumed_ts, cost.down_s) == (T0, T0 + 42.5, 42.5)
    assert (cost.ckpt_step, cost.fault_step) == (100, 150)
    assert cost.recompute_s == pytest.approx(5.0)
    assert cost.gpu_hours == pytest.approx(16 * 47.5 / 3600)
    assert incident_cost(journal.timeline(iid))["gpu_hours"] == pytest.approx(16 * 47.5 / 3600, abs=1e-6)
    m = loop.metrics
    assert m.gpu_hours_lost.labels(pool="h100", fault_class="gpu-fatal")._value.get() == pytest.approx(
        cost.gpu_hours
    )
    ett = m.effective_training.labels(pool="h100")._value.get()
    assert ett == pytest.approx(1 - cost.gpu_hours / (48 * 24))
    assert loop.reconcile() == 0 and [e.phase for e in journal.timeline(iid)].count(COST_PHASE) == 1


def test_a_progress_file_outside_the_roots_is_not_read(
    journal: Journal, inbox: Inbox, tmp_path: Path
) -> None:
    (tmp_path / "elsewhere").mkdir()
    progress = progress_file(tmp_path / "elsewhere" / "progress.jsonl")
    iid = requeue(journal, "gpu-1", [52])
    jobs = Jobs(
        {52: job(52, "alice", "RUNNING", nodes="gpu-5", start_ts=T0 + 38, comment=f"progress={progress}")}
    )
    loop = make_loop(journal, inbox.url, jobs, Clock(T0 + 50), progress_roots=(tmp_path / "roots",))
    loop.reconcile()
    loop.reconcile()
    (cost,) = costs_from(journal.timeline(iid))
    assert cost.recompute_s is None and cost.resumed_ts == T0 + 38  # Slurm's start stands in
    assert "from its last checkpoint" in inbox.posts[1]["text"]


def test_waiting_for_capacity(journal: Journal, inbox: Inbox) -> None:
    iid = requeue(journal, "gpu-1", [61])
    close(journal, iid, reason="no spare: jobs wait for capacity")
    loop = make_loop(journal, inbox.url, Jobs({61: job(61, "alice", reason="Resources")}), Clock(T0 + 60))
    assert loop.reconcile() == 1  # hit
    assert loop.reconcile() == 1  # waiting
    assert "Job(s) 61 wait for capacity" in inbox.posts[1]["text"]
    assert loop.reconcile() == 0


def test_the_directory(tmp_path: Path) -> None:
    path = tmp_path / "owners.yaml"
    path.write_text("alice: {email: alice@example.org}\nbob: {slack: U0123ABCD}\n")
    d = OwnerDirectory.load(path)
    assert d.contact("alice") == Contact("email", "alice@example.org")
    assert d.contact("bob", "bob@example.org") == Contact("slack", "U0123ABCD")  # the directory first
    assert d.contact("carol", "carol@example.org") == Contact("email", "carol@example.org")
    assert OwnerDirectory.load(path, mail_user=False).contact("carol", "carol@example.org") is None
    path.write_text("dave: {slack: 'not an id'}\n")
    with pytest.raises(RunnerConfigError, match=r"dave: a contact is .*Slack user id"):
        OwnerDirectory.load(path)


def test_parse_scontrol_show_job() -> None:
    line = (
        "JobId=7 JobName=autoheal-train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=1"
        " JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1"
        " StartTime=2026-12-03T16:50:00 Partition=batch NodeList=gpu-[3-4] NumNodes=2 NumCPUs=2"
        " TRES=cpu=2,mem=2G,node=2,billing=2,gres/gpu=16 Comment=progress=/ck/progress.jsonl"
        " MailUser=alice@example.org TresPerNode=gres:gpu:8"
    )
    j = parse_job(line)
    assert j is not None
    assert (j.job_id, j.user, j.state, j.nodes, j.gpus, j.restarts) == (
        7,
        "alice",
        "RUNNING",
        "gpu-[3-4]",
        16,
        1,
    )
    assert j.progress_path == Path("/ck/progress.jsonl") and j.mail_user == "alice@example.org"
    assert j.start_ts is not None
    no_tres = parse_job(line.replace("gres/gpu=16", ""))
    assert no_tres is not None and no_tres.gpus == 16  # TresPerNode x NumNodes (Slurm 22.05's way)
    # a pool's GPUs, from `sinfo -p POOL -o "%D|%G"` (22.05's partition TRES has no gres)
    assert pool_gpus_of("6|gpu:h100:8\n2|gpu:8(S:0-1),shard:4\n1|(null)\n") == 64


def test_a_job_that_left_before_the_play_looked_keeps_its_nodes(tmp_path: Path) -> None:
    """The warm fence signals a job and its requeue runs before the play lists the jobs: Slurm then
    shows it pending on no node. The run's ledger keeps its nodes from the signal, so the play's
    `requeued` report names it under its node (and the owner loop finds it)."""
    from tests.runbook.conftest import plugin

    ledger_mod = plugin("module_utils.slurm_signal")
    jobs_mod = plugin("modules.slurm_jobs")
    path = str(tmp_path / "signalled.json")
    with ledger_mod.SignalLedger(path) as ledger:
        ledger.add([7], T0, {7: ["gpu-1", "gpu-2"], 8: ["gpu-9"]})
    left = {"job_id": 7, "nodes": []}
    other = {"job_id": 9, "nodes": []}
    out = jobs_mod.with_ledger_nodes([left, other], path)
    assert out == [{"job_id": 7, "nodes": ["gpu-1", "gpu-2"]}, {"job_id": 9, "nodes": []}]
    assert json.loads(Path(path).read_text())["nodes"] == {"7": ["gpu-1", "gpu-2"]}  # 8 was not signalled
    events = plugin("filter.journal_events").evacuation_events(
        {"jobs": out, "requeued_job_ids": [7], "signalled_at": T0}, ["gpu-1"], {"gpu-1": "inc-1"}
    )
    assert [e["detail"] for e in events] == ["jobs 7", "requeued 7"]


def test_a_sigterm_checkpoint_past_the_last_reported_step_loses_no_work() -> None:
    """The job kept training after the fault until its SIGTERM checkpoint (step 79; its last step
    record before the fault was 60): nothing is recomputed, only the down time counts."""
    from remediation.cost import job_cost, read_progress

    events = [
        {"ts": T0 - 2.0, "event": "step", "step": 60},
        {"ts": T0 + 1.5, "event": "checkpoint", "step": 79, "reason": "sigterm"},
        {"ts": T0 + 20.0, "event": "start", "step": 79, "restart": 1},
        {"ts": T0 + 30.0, "event": "first_step", "step": 80, "restart": 1},
    ]
    p = read_progress(events, T0)
    assert (p.fault_step, p.ckpt_step, p.recompute_s, p.resumed_ts) == (60, 79, 0.0, T0 + 30.0)
    cost = job_cost(1, 16, T0, T0 + 20.0, p, "h100")
    assert cost.gpu_hours == pytest.approx(16 * 30 / 3600)
    assert cost.line() == "job 1: 16 GPUs x (30.0 s down + 0.0 s recomputed) = 0.1333 GPU-h"


def test_incident_show_and_incidents_json_carry_the_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import typer
    from typer.testing import CliRunner

    from remediation.cli import register
    from remediation.cost import job_cost, read_progress
    from tests.remediation.remhelp import write_config

    monkeypatch.setenv("AUTOHEAL_CONFIG", str(write_config(tmp_path)))
    app = typer.Typer()
    register(app)
    j = Journal(tmp_path / "journal.sqlite")
    iid = requeue(j, "gpu-1", [71])
    events = json.loads("[" + ",".join(progress_file(tmp_path / "p.jsonl").read_text().splitlines()) + "]")
    cost = job_cost(71, 16, T0, T0 + 38, read_progress(events, T0), "h100")
    with j.transaction() as tx:
        tx.timeline(iid, COST_PHASE, "ok", source="runner", detail=json.dumps(cost.as_dict()))
    j.close()
    shown = CliRunner().invoke(app, ["incident", "show", iid])
    assert shown.exit_code == 0, shown.output
    assert "cost: job 71: 16 GPUs x (42.5 s down + 5.0 s recomputed) = 0.2111 GPU-h" in shown.output
    listed = CliRunner().invoke(app, ["incidents", "--json"])
    (row,) = json.loads(listed.output)
    assert row["cost"]["gpu_hours"] == pytest.approx(16 * 47.5 / 3600, abs=1e-6)
    assert row["cost"]["jobs"][0]["ckpt_step"] == 100


def test_the_dashboard_renders_and_reads_only_the_runners_metrics(tmp_path: Path) -> None:
    """`autoheal dashboard --out`: Grafana's JSON with a panel per spec, and every metric a query
    names is one the runner exports (its values against a real Prometheus: tests/e2e/test_demo.py)."""
    import re

    import typer
    from typer.testing import CliRunner

    from remediation import dashboard
    from remediation.cli import register

    app = typer.Typer()
    register(app)
    out = tmp_path / "autoheal.json"
    res = CliRunner().invoke(app, ["dashboard", "--out", str(out)])
    assert res.exit_code == 0, res.output
    board = json.loads(out.read_text())
    assert board["uid"] == dashboard.UID and len(board["panels"]) == len(dashboard.PANELS)
    exprs = {t["expr"] for p in board["panels"] for t in p["targets"]}
    assert exprs == {q for _t, q, _n in dashboard.queries()}
    assert all(t["datasource"]["uid"] == "${datasource}" for p in board["panels"] for t in p["targets"])
    families = Metrics().registry.collect()
    exported = {f.name + end for f in families for end in ("", "_total", "_bucket", "_count", "_sum")}
    named = {n for e in exprs for n in re.findall(r"\b(autoheal_[a-z_]+)", e)}
    assert named <= exported, named - exported
