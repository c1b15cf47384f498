"""Helpers of the fault tests: a runner process we can kill, and a notification sink we can stop.

(Named uniquely so pytest's rootdir imports cannot collide with other test folders.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tests.support import wait_for

REPO = Path(__file__).resolve().parents[2]
# The real runbook's phases (playbooks/gpu_fatal_xid.yml), for the stub play
RUNBOOK_PHASES = "fenced,jobs_signalled,spare_promoted,requeued,drained,retired,replacement_ready"


class RunnerProcess:
    """`autoheal-runner serve` as a child process; start() again after a kill is a restart."""

    def __init__(self, tmp: Path, config: Path, port: int, env: dict[str, str]) -> None:
        self.tmp, self.config, self.port, self.env = tmp, config, port, env
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, n: int = -1) -> str:
        return (self.tmp / f"serve-{len(self.procs) + n if n < 0 else n}.log").read_text(errors="replace")

    def start(self, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"serve-{len(self.procs)}.log").open("wb")
        p = subprocess.Popen(
            [sys.executable, "-m", "remediation", "serve", "--config", str(self.config)],
            cwd=REPO,
            env={**os.environ, **self.env, "PYTHONPATH": str(REPO), **(extra_env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(p)

        def ready() -> bool:
            assert p.poll() is None, self.log()
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, "runner to be ready")
        return p

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


class Sink:
    """A notification webhook on loopback that records every event; stop() makes it unreachable."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.events: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/notify"

    def start(self) -> None:
        events = self.events

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                events.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == event]
