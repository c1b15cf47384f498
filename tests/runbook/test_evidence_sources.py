"""The evidence bundle's production sources, fast: the watcher's kernel line from the kernel record
to the runner's file (through the real intake and journal), the evidence Job's report (its script
from roles/ladder/tasks/evidence.yml run by a real shell against stand-in tools), and the module
writing them - with every failure recorded in the bundle, never fatal."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from autoheal.monitoring import KERNEL_LINE_ANNOTATION
from autoheal.xid import load_catalog
from autoheal.xid_messages import MAX_LINE, XidLine, parse_message
from remediation import kernel_lines
from remediation.executor import PlayVars
from remediation.incidents import Intake
from remediation.journal import Journal
from remediation.models import WebhookPayload
from remediation.rules import load_rules
from tests.remediation.remhelp import alert, make_config, payload
from tests.runbook.conftest import REPO, plugin, run_module
from tests.support import port_base, wait_for
from watcher.alerts import alert_for
from watcher.gpus import GpuMap

sources = plugin("module_utils.evidence_sources")
evidence_filter = plugin("filter.evidence_nodes")
PORTS = port_base(26500)  # +0 the exporter, +1 Prometheus, +2 nothing listens
XID_RECORD = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def job_script() -> list[str]:
    """The command of the evidence Job, as the ladder's evidence tasks give it."""
    tasks = yaml.safe_load((REPO / "roles/ladder/tasks/evidence.yml").read_text())
    task = next(t for t in tasks if "autoheal.cluster.node_job" in t)
    return [str(a) for a in task["autoheal.cluster.node_job"]["command"]]


def fake_tools(tmp_path: Path, smi: str, dcgmi: str) -> dict[str, str]:
    """nvidia-smi and dcgmi stand-ins on PATH: `smi`/`dcgmi` are shell bodies."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("nvidia-smi", smi), ("dcgmi", dcgmi)):
        f = bin_dir / name
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_job_script(tmp_path: Path, smi: str, dcgmi: str) -> str:
    env = fake_tools(tmp_path, smi, dcgmi)
    res = subprocess.run(job_script(), env=env, capture_output=True, text=True, timeout=30, check=True)
    return res.stdout


# -- the watcher's kernel line -> the incident -> the runner's file --------------------------------


def xid_event(record: str) -> XidLine:
    event = parse_message(record)[0]
    assert isinstance(event, XidLine)
    return event


def test_the_watchers_alert_carries_the_kernel_record_sanitised_and_bounded():
    event = xid_event(XID_RECORD)
    a = alert_for(event, "gpu-1", GpuMap("none"), load_catalog(), 1.0, XID_RECORD)
    assert a is not None and a.annotations[KERNEL_LINE_ANNOTATION] == XID_RECORD
    hostile = XID_RECORD + " {{ lookup('pipe', 'id') }}\x1b[31m\x00" + "A" * 2000
    b = alert_for(xid_event(hostile), "gpu-1", GpuMap("none"), load_catalog(), 1.0, hostile)
    assert b is not None
    line = b.annotations[KERNEL_LINE_ANNOTATION]
    assert len(line) <= MAX_LINE and all(" " <= c <= "~" for c in line) and "\x1b" not in line
    # no record, no annotation (the alert is as before)
    c = alert_for(event, "gpu-1", GpuMap("none"), load_catalog(), 1.0)
    assert c is not None and KERNEL_LINE_ANNOTATION not in c.annotations


def test_the_runner_keeps_the_line_with_the_incident_and_hands_the_play_only_a_file(tmp_path):
    cfg = make_config(tmp_path)
    assert cfg.journal_path is not None
    journal = Journal(cfg.journal_path)
    try:
        intake = Intake(journal, load_rules(cfg.rules_file), load_catalog(), 900)
        first = alert("gpu-1", starts_at="2026-11-30T03:46:01.103Z")
        first["annotations"][KERNEL_LINE_ANNOTATION] = XID_RECORD
        forged = alert("gpu-2")  # not a driver line: not kept, whatever else the alert says
        forged["annotations"][KERNEL_LINE_ANNOTATION] = "{{ lookup('pipe', 'reboot') }}"
        res = intake.record(WebhookPayload.model_validate(payload(first, forged)))
        inc1, inc2 = res.created
        assert kernel_lines.lines_of(journal, inc1) == [f"2026-11-30T03:46:01.103000Z {XID_RECORD}"]
        assert kernel_lines.lines_of(journal, inc2) == []

        path = kernel_lines.write_for_run(
            journal, tmp_path / "runs" / "7", [("gpu-1", inc1), ("gpu-2", inc2)]
        )
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        data = json.loads(path.read_text())
        assert data == {"nodes": {"gpu-1": [f"2026-11-30T03:46:01.103000Z {XID_RECORD}"], "gpu-2": []}}
        play = PlayVars(
            nodes=("gpu-1",),
            incident_ids=(inc1,),
            xid=79,
            gpu=3,
            tier="reboot",
            opt_out=False,
            dry_run=False,
            grace_seconds=5,
            journal_events=tmp_path / "runs" / "7" / "journal-events.jsonl",
            kernel_lines=path,
        ).extravars()
        assert play["autoheal_kernel_lines"] == str(path)
        assert XID_RECORD not in json.dumps(play)  # the text itself never is an extra var
    finally:
        journal.close()


def test_the_kernel_lines_file_is_read_bounded_and_a_bad_one_says_why(tmp_path):
    f = tmp_path / "lines.json"
    f.write_text(json.dumps({"nodes": {"gpu-1": ["a\x00b", "x" * 5000] + ["l"] * 600}}))
    got = sources.kernel_lines(str(f), ["gpu-1", "gpu-9"])
    assert len(got["gpu-1"]) == sources.MAX_LINES and got["gpu-9"] == []
    f.write_text(json.dumps({"nodes": {"gpu-1": ["a\x00b", "x" * 5000]}}))
    one, two = sources.kernel_lines(str(f), ["gpu-1"])["gpu-1"]
    assert one == "a?b" and two.startswith("x" * sources.MAX_LINE) and "\n" not in two
    f.write_text("[1, 2]")
    for bad in (f, tmp_path / "absent.json"):
        try:
            sources.kernel_lines(str(bad), ["gpu-1"])
        except (OSError, ValueError) as exc:
            assert str(bad) in str(exc)
        else:
            raise AssertionError(f"{bad} was read")


# -- the evidence Job's report ---------------------------------------------------------------------


def test_the_job_script_and_the_report_parser_agree(tmp_path):
    logs = run_job_script(
        tmp_path, "echo 'GPU 00000000:3B:00.0'; echo '    Serial Number : 1652'", "echo '{\"body\": {}}'"
    )
    files, record, missing = sources.node_report({"ok": True, "exit_code": 0, "logs": logs, "job": "j-1"})
    assert missing == [] and record["sections"] == {"nvidia-smi -q": 0, "dcgmi health -c -j": 0}
    assert "Serial Number : 1652" in files["nvidia_smi_q.txt"] and "###" not in files["nvidia_smi_q.txt"]
    assert json.loads(files["dcgm_health.json"]) == {"body": {}}

    # a failing command is recorded with its exit code; the other section is kept
    logs = run_job_script(tmp_path, "echo 'Unable to determine the device handle'; exit 15", "echo '{}'")
    files, record, missing = sources.node_report({"ok": True, "exit_code": 0, "logs": logs})
    assert missing == ["nvidia-smi -q: exit code 15"] and "device handle" in files["nvidia_smi_q.txt"]
    logs = run_job_script(tmp_path, "echo ok", "exit 127")
    assert sources.node_report({"ok": True, "logs": logs})[2] == ["dcgmi health -c -j: exit code 127"]


def test_a_failed_or_cut_job_is_recorded_with_its_reason_and_its_text_is_bounded():
    cut = "### autoheal-evidence nvidia-smi -q\nGPU 0\n"  # the Job was killed in the first command
    files, record, missing = sources.node_report(
        {"ok": False, "exit_code": None, "reason": "timed out after 180s", "logs": cut, "job": "j"}
    )
    assert files == {"nvidia_smi_q.txt": "GPU 0"} and record["ok"] is False
    assert missing == [
        "node_report: the evidence Job failed: timed out after 180s",
        "nvidia-smi -q: cut short",
        "dcgmi health -c -j: not in the Job's output",
    ]
    files, _, missing = sources.node_report(
        {"ok": False, "reason": "Pending 60s: image pull", "logs": "exec: sh: not found"}
    )
    assert files == {"node_job.log": "exec: sh: not found"} and missing[0].endswith("image pull")
    huge = "### autoheal-evidence nvidia-smi -q\n" + "\x1b" * (sources.MAX_REPORT + 10)
    text = sources.node_report({"ok": True, "logs": huge})[0]["nvidia_smi_q.txt"]
    assert len(text) < sources.MAX_REPORT + 100 and "\x1b" not in text and text.endswith("characters]")
    assert sources.node_report(None)[2] == ["node_report: no evidence Job result for this node"]


def test_evidence_nodes_gives_each_node_its_job_or_why_there_is_none():
    jobs = {"node_results": {"gpu-1": {"ok": True, "logs": "x", "exit_code": 0, "reason": "", "job": "j"}}}
    out = evidence_filter.evidence_nodes(["gpu-1", "gpu-2"], {}, [], {}, jobs)
    assert out[0]["report"]["ok"] is True
    assert out[1]["report"]["ok"] is False and "no result" in out[1]["report"]["reason"]
    skipped = evidence_filter.evidence_nodes(["gpu-1"], {}, [], {}, {"skipped": True})
    assert "not started" in skipped[0]["report"]["reason"]
    failed = evidence_filter.evidence_nodes(
        ["gpu-1"], {}, [], {}, {"failed": True, "msg": "kubeconfig: unreadable"}
    )
    assert failed[0]["report"]["reason"] == "kubeconfig: unreadable"
    assert "report" not in evidence_filter.evidence_nodes(["gpu-1"])[0]  # the lab: no Job


def test_the_prometheus_query_names_only_the_nodes():
    q = sources.prometheus_query(["gpu-1", "node.a"])
    assert q == '{__name__=~"DCGM_FI_DEV_.+",Hostname=~"gpu-1|node\\\\.a"}'


# -- the module writes them, recording what failed -----------------------------------------------


def bundle(tmp_path: Path, inc: str, node: str) -> dict[str, str]:
    with tarfile.open(tmp_path / "evidence" / f"{inc}-{node}.tar.gz") as tar:
        return {
            m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
            for m in tar.getmembers()
            if m.isfile()
        }


def test_the_module_writes_the_production_sources_and_records_each_failure(tmp_path):
    lines = tmp_path / "kernel-lines.json"
    lines.write_text(json.dumps({"nodes": {"gpu-1": [f"2026-11-30T03:46:01Z {XID_RECORD}"]}}))
    logs = run_job_script(tmp_path, "echo 'Serial Number : 1652'", "echo '{\"ok\": 1}'")
    args: dict[str, Any] = {
        "nodes": [
            {
                "node": "gpu-1",
                "incident_id": "inc-000000000001",
                "report": {"ok": True, "exit_code": 0, "logs": logs, "job": "j1"},
            },
            {
                "node": "gpu-2",
                "incident_id": "inc-000000000002",
                "report": {"ok": False, "reason": "timed out after 5s", "logs": ""},
            },
        ],
        "xid": 79,
        "dir": str(tmp_path / "evidence"),
        "kernel_lines": str(lines),
        "prometheus_url": "http://127.0.0.1:9",  # nothing listens: recorded, not fatal
    }
    dry = run_module("evidence", args, check=True)
    assert not dry["failed"] and dry["changed"] and not (tmp_path / "evidence").exists(), dry
    res = run_module("evidence", args)
    assert not res["failed"] and res["changed"], res
    one = bundle(tmp_path, "inc-000000000001", "gpu-1")
    assert XID_RECORD in one["xid_lines.txt"] and "Serial Number : 1652" in one["nvidia_smi_q.txt"]
    assert json.loads(one["dcgm_health.json"]) == {"ok": 1}
    summary = json.loads(one["summary.json"])
    assert summary["evidence_job"]["ok"] is True and summary["evidence_job"]["job"] == "j1"
    assert [m.split(":")[0] for m in summary["missing"]] == ["prometheus"]
    assert "http://127.0.0.1:9" in summary["missing"][0]
    two = json.loads(bundle(tmp_path, "inc-000000000002", "gpu-2")["summary.json"])
    assert "node_report: the evidence Job failed: timed out after 5s" in two["missing"]
    assert res["bundles"][1]["missing"] == two["missing"]
    for p in (tmp_path / "evidence").rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o750 if p.is_dir() else 0o640), (p, oct(mode))

    before = {str(p): p.stat().st_mtime_ns for p in (tmp_path / "evidence").rglob("*")}
    again = run_module("evidence", {**args, "kernel_lines": str(tmp_path / "gone.json")})
    assert not again["failed"] and not again["changed"], again
    assert {str(p): p.stat().st_mtime_ns for p in (tmp_path / "evidence").rglob("*")} == before


def test_the_module_refuses_a_prometheus_url_that_is_not_http(tmp_path):
    res = run_module(
        "evidence",
        {"node": "gpu-1", "xid": 79, "dir": str(tmp_path / "e"), "prometheus_url": "file:///etc/shadow"},
    )
    assert res["failed"] and res["msg"].startswith("prometheus_url:") and not (tmp_path / "e").exists()


# -- the node's last metrics from a real Prometheus ------------------------------------------------

EXPOSITION = b"""# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-aaa",Hostname="gpu-1"} 71
DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-bbb",Hostname="gpu-1"} 44
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-aaa",Hostname="gpu-1"} 79
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-ccc",Hostname="gpu-2"} 40
node_load1{Hostname="gpu-1"} 3
"""


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[str]:
    """A real Prometheus scraping an exposition of two nodes' DCGM series every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("PROMETHEUS NOT TESTED: the prometheus binary is not installed (scripts/bootstrap.sh)")

    class Exporter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(EXPOSITION)

        def log_message(self, *args: object) -> None:
            pass

    exporter = ThreadingHTTPServer(("127.0.0.1", PORTS), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "dcgm",
                        "honor_labels": True,
                        "static_configs": [{"targets": [f"127.0.0.1:{PORTS}"]}],
                    }
                ],
            }
        )
    )
    url = f"http://127.0.0.1:{PORTS + 1}"
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={conf}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{PORTS + 1}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def scraped() -> bool:
        try:
            q = httpx.get(f"{url}/api/v1/query", params={"query": "DCGM_FI_DEV_GPU_TEMP"}, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return False
        return len(q["data"]["result"]) == 3

    try:
        wait_for(scraped, 60, "Prometheus to scrape the exporter")
        yield url
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        exporter.shutdown()
        exporter.server_close()


def test_the_nodes_last_metrics_come_from_a_real_prometheus_and_its_absence_is_recorded(tmp_path, prometheus):
    args = {
        "nodes": [{"node": "gpu-1", "incident_id": "inc-000000000011"}],
        "xid": 79,
        "dir": str(tmp_path / "evidence"),
    }
    res = run_module(
        "evidence", {**args, "prometheus_url": prometheus, "metrics_window": 120, "metrics_step": 1}
    )
    assert not res["failed"] and res["bundles"][0]["missing"] == [], res
    got = json.loads(bundle(tmp_path, "inc-000000000011", "gpu-1")["prometheus.json"])
    series = {(s["metric"]["__name__"], s["metric"]["gpu"]): s["values"] for s in got["series"]}
    assert set(series) == {
        ("DCGM_FI_DEV_GPU_TEMP", "0"),
        ("DCGM_FI_DEV_GPU_TEMP", "1"),
        ("DCGM_FI_DEV_XID_ERRORS", "0"),
    }
    assert series[("DCGM_FI_DEV_XID_ERRORS", "0")][-1][1] == "79"  # the last minutes, point by point
    assert got["step"] == 1 and got["end"] - got["start"] == 120 and "gpu-1" in got["query"]

    # Prometheus gone: the bundle is still written, saying where it looked and why it failed
    down = {**args, "nodes": [{"node": "gpu-1", "incident_id": "inc-000000000012"}]}
    res = run_module("evidence", {**down, "prometheus_url": f"http://127.0.0.1:{PORTS + 2}"})
    assert not res["failed"] and res["changed"], res
    (why,) = res["bundles"][0]["missing"]
    assert why.startswith(f"prometheus: http://127.0.0.1:{PORTS + 2}: ") and "refused" in why.lower(), why
    assert "prometheus.json" not in bundle(tmp_path, "inc-000000000012", "gpu-1")
