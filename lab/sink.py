"""A webhook receiver that records what Alertmanager posts, for the demo and the tests.

It stands where the runner will stand (same URL, same bearer token check) so the alert path
simulator -> Prometheus -> Alertmanager -> webhook is measured end to end before any remediation.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from lab.httpd import LabHTTPServer


@dataclass
class Delivery:
    at: float
    authorization: str
    payload: dict[str, Any]


@dataclass
class WebhookSink:
    port: int
    token: str | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _server: LabHTTPServer | None = None

    def start(self) -> WebhookSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                auth = self.headers.get("Authorization", "")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = sink.token is None or auth == f"Bearer {sink.token}"
                self.send_response(200 if ok else 401)
                self.end_headers()
                if ok:
                    with sink._cond:
                        sink.deliveries.append(Delivery(time.time(), auth, json.loads(body)))
                        sink._cond.notify_all()

        self._server = LabHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    def wait_for(self, match: dict[str, str], timeout: float, since: float = 0.0) -> Delivery:
        """The first delivery after `since` with a firing alert whose labels include `match`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for d in self.deliveries:
                    if d.at < since:
                        continue
                    for a in d.payload.get("alerts", []):
                        labels = a.get("labels", {})
                        if a.get("status") == "firing" and all(labels.get(k) == v for k, v in match.items()):
                            return d
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no webhook with labels {match} within {timeout}s")
                self._cond.wait(left)
