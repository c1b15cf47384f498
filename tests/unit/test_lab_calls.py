"""The lab's daemons under a storm's burst of calls: the simulator's dropped connection costs one
node a retry, not a batch its reboot; a bug in the pool API answers 500 naming it."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoheal.errors import LabError
from lab import ladder, pool
from lab.config import LabConfig
from lab.httpd import LabHTTPServer
from tests.support import port_base

PORT_BASE = port_base(24950)  # only the simulator's port (+4) is used


class _Flaky(BaseHTTPRequestHandler):
    """Drops the first `drops` connections without a word (as a full backlog did), then answers."""

    drops = 1
    seen = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        type(self).seen += 1
        if type(self).seen <= type(self).drops:
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        body = json.dumps({"node": "gpu-1", "rebooted": True}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def simulator(tmp_path: Path) -> Iterator[tuple[LabConfig, type[_Flaky]]]:
    handler = type("Flaky", (_Flaky,), {"seen": 0})
    cfg = LabConfig(name="calls", root=tmp_path, port_base=PORT_BASE)
    server = LabHTTPServer(("127.0.0.1", cfg.port("simulator")), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield cfg, handler
    finally:
        server.shutdown()
        server.server_close()


def test_a_burst_queues_instead_of_being_refused() -> None:
    assert LabHTTPServer.request_queue_size >= 128 > 5  # socketserver's default refused a storm's burst


def test_a_dropped_connection_is_tried_again(simulator: tuple[LabConfig, type[_Flaky]]) -> None:
    cfg, handler = simulator
    assert ladder._post(cfg, "/v1/reboot", {"node": "gpu-1"}, timeout=5)["rebooted"] is True
    assert handler.seen == 2


def test_a_call_that_keeps_failing_is_that_nodes_lab_error(simulator: tuple[LabConfig, type[_Flaky]]) -> None:
    cfg, handler = simulator
    handler.drops = 99
    with pytest.raises(LabError, match=r"simulator /v1/reboot: .* \(3 tries\)"):
        ladder._post(cfg, "/v1/reboot", {"node": "gpu-1"}, timeout=5)
    assert handler.seen == ladder.CALL_ATTEMPTS


def test_the_pool_api_answers_a_bug_with_500_naming_it(tmp_path: Path) -> None:
    class Broken:
        def ladder(self, what: str, body: dict[str, Any]) -> list[dict[str, Any]]:
            raise RuntimeError("boom in the batch")

    server = LabHTTPServer(("127.0.0.1", 0), pool._handler(Broken()))  # type: ignore[arg-type]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{server.server_address[1]}/v1/ladder/reboot", json={"nodes": ["gpu-1"]}
        )
        assert r.status_code == 500 and r.json() == {"error": "RuntimeError: boom in the batch"}
    finally:
        server.shutdown()
        server.server_close()
