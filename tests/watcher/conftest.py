"""Fixtures for the watcher's tests: the real Alertmanager (Debian's 0.25) loaded with the route
autoheal ships, a webhook sink standing where the runner stands, and the watcher as a process."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from autoheal.kmsg import format_record
from autoheal.monitoring import render_alertmanager_config
from lab.sink import WebhookSink
from lab.sysfs import FakeSysfs
from tests.support import wait_for
from watcher.config import WatcherConfig
from watcher.daemon import Watcher

AM_BIN = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
TOKEN = "watcher-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Am:
    url: str
    sink: WebhookSink
    proc: subprocess.Popen[bytes]
    port: int

    def alerts(self, **match: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v2/alerts", timeout=5)
        r.raise_for_status()
        return [a for a in r.json() if all(a["labels"].get(k) == v for k, v in match.items())]


def start_alertmanager(d: Path, port: int, sink_port: int) -> subprocess.Popen[bytes]:
    d.mkdir(parents=True, exist_ok=True)
    token = d / "token"
    token.write_text(TOKEN)
    conf = render_alertmanager_config(
        f"http://127.0.0.1:{sink_port}/webhook", str(token), group_interval="1s"
    )
    (d / "alertmanager.yml").write_text(yaml.safe_dump(conf))
    proc = subprocess.Popen(
        [
            AM_BIN,
            f"--config.file={d / 'alertmanager.yml'}",
            f"--storage.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=(d / "alertmanager.log").open("ab"),
        stderr=subprocess.STDOUT,
    )

    def ready() -> bool:
        assert proc.poll() is None, (d / "alertmanager.log").read_text()[-2000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 30, "alertmanager to be ready")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture
def am(tmp_path: Path) -> Iterator[Am]:
    if not shutil.which(AM_BIN):
        pytest.skip("prometheus-alertmanager not installed")
    sink = WebhookSink(free_port(), TOKEN).start()
    port = free_port()
    proc = start_alertmanager(tmp_path / "am", port, sink.port)
    a = Am(f"http://127.0.0.1:{port}", sink, proc, port)
    try:
        yield a
    finally:
        stop(a.proc)
        sink.stop()


class KmsgFile:
    """A simulated node's kernel log: kmsg records appended with growing sequence numbers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = 0
        path.touch()

    def write(self, *messages: str, raw: bytes | None = None) -> None:
        import time

        with self.path.open("ab") as fh:
            for m in messages:
                fh.write(format_record(self.seq, int(time.monotonic() * 1e6), m).encode())
                self.seq += 1
            if raw is not None:
                fh.write(raw)


@dataclass
class WatcherProc:
    proc: subprocess.Popen[bytes]
    log: Path
    metrics_url: str

    def metric(self, name: str) -> float:
        text = httpx.get(self.metrics_url, timeout=2).text
        total = 0.0
        found = False
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
                found = True
        assert found, f"{name} not in the watcher's metrics"
        return total


@pytest.fixture
def gpu_csv(tmp_path: Path) -> Path:
    """This node's GPUs as nvidia-smi prints them: GPU i at bus 0000:<18+16i>:00."""
    rows = [f"{i}, 00000000:{0x18 + 16 * i:02X}:00.0, GPU-{i:08x}-1111-2222-3333-{i:012x}" for i in range(8)]
    p = tmp_path / "gpus.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def bus(i: int) -> str:
    return f"0000:{0x18 + 16 * i:02x}:00"


@pytest.fixture
def watcher_factory(tmp_path: Path, gpu_csv: Path) -> Iterator[Callable[..., WatcherProc]]:
    started: list[WatcherProc] = []

    def start(am_url: str, kmsg: Path, *extra: str, node: str = "gpu-2") -> WatcherProc:
        port = free_port()
        log = tmp_path / f"watcher-{len(started)}.log"
        argv = [
            sys.executable,
            "-m",
            "watcher",
            f"--node={node}",
            f"--alertmanager={am_url}",
            f"--state={tmp_path / 'watcher-state.json'}",
            "--source=kmsg",
            f"--path={kmsg}",
            f"--gpu-map=file:{gpu_csv}",
            f"--listen=127.0.0.1:{port}",
            *extra,
        ]
        proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        w = WatcherProc(proc, log, f"http://127.0.0.1:{port}/metrics")

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "the watcher's /healthz")
        started.append(w)
        return w

    yield start
    for w in started:
        stop(w.proc)


@pytest.fixture
def sysfs(tmp_path: Path) -> FakeSysfs:
    """A fake sysfs tree for the link check (lab/sysfs.py)."""
    return FakeSysfs(tmp_path / "sys")


def link_watcher(tmp_path: Path, sysfs: FakeSysfs, node: str = "gpu-2") -> Watcher:
    """A watcher reading a kernel log file of its own, its link check on `sysfs`, posting nowhere."""
    cfg = WatcherConfig.model_validate(
        {
            "node": node,
            "source": "file",
            "path": tmp_path / "kern.log",
            "alertmanagers": ["http://127.0.0.1:9"],
            "state_file": tmp_path / "state.json",
            "gpu_map": "none",
            "sysfs_root": sysfs.root,
        }
    )
    return Watcher(cfg)
