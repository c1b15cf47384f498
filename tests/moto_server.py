"""AWS for tests: moto as a server PROCESS (the real wire protocol: boto3 signs and sends HTTP,
moto answers as EC2 and Auto Scaling do), and a loopback proxy in front of it that answers the
first requests with AWS's own throttling errors.

    with MotoServer(port) as moto:           # started, answering; stopped (by PID) on exit
        env = moto.env()                     # AWS_ENDPOINT_URL, AWS_REGION, test credentials
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support import pid_alive, wait_for

VENV_BIN = Path(sys.executable).parent
REGION = "us-east-1"
AZ = "us-east-1a"


class MotoServer:
    """`moto_server -H 127.0.0.1 -p PORT` as a child process; `extra_env` for moto's own settings
    (INITIAL_NO_AUTH_ACTION_COUNT turns IAM enforcement on after that many requests)."""

    def __init__(self, port: int, log: Path, extra_env: dict[str, str] | None = None) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> MotoServer:
        exe = VENV_BIN / "moto_server"
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "moto.server"]
        env = {**os.environ, **self.extra_env}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*argv, "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        wait_for(self._answers, timeout, f"moto_server on {self.url} (log {self.log})")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"moto_server exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            # moto's own API: not an AWS action, so it does not count against INITIAL_NO_AUTH_ACTION_COUNT
            with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        assert not pid_alive(self.proc.pid)

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self, url: str | None = None, key: str = "testing", secret: str = "testing") -> dict[str, str]:
        """The standard AWS environment pointing at this server (or at `url`, a proxy in front)."""
        return {
            "AWS_ENDPOINT_URL": url or self.url,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }


# AWS's own throttling answers, per protocol: EC2's query API, and the awsquery one of Auto Scaling
EC2_THROTTLE = (
    503,
    "<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>RequestLimitExceeded</Code>"
    "<Message>Request limit exceeded.</Message></Error></Errors><RequestID>{rid}</RequestID></Response>",
)
QUERY_THROTTLE = (
    400,
    "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>"
    "</Error><RequestId>{rid}</RequestId></ErrorResponse>",
)


class ThrottlingProxy:
    """A loopback HTTP proxy to moto that answers the first `throttle` requests whose Action is
    in `actions` (all when empty) with AWS's throttling error; `seen` counts what it answered."""

    def __init__(self, port: int, upstream: str, throttle: int, actions: tuple[str, ...] = ()) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.upstream = upstream
        self.left = throttle
        self.actions = actions
        self.throttled: list[str] = []
        self.passed: list[str] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                action = dict(urllib.parse.parse_qsl(body.decode())).get("Action", "?")
                with proxy._lock:
                    throttle = proxy.left > 0 and (not proxy.actions or action in proxy.actions)
                    if throttle:
                        proxy.left -= 1
                        proxy.throttled.append(action)
                    else:
                        proxy.passed.append(action)
                if throttle:
                    status, text = (
                        EC2_THROTTLE if "ec2" in self.headers.get("Authorization", "") else QUERY_THROTTLE
                    )
                    self._answer(status, text.format(rid=uuid.uuid4()).encode(), "text/xml")
                    return
                req = urllib.request.Request(
                    proxy.upstream + self.path,
                    data=body,
                    headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
                    method="POST",
                )
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        self._answer(r.status, r.read(), r.headers.get("Content-Type", "text/xml"))
                except urllib.error.HTTPError as err:
                    self._answer(err.code, err.read(), err.headers.get("Content-Type", "text/xml"))

            def _answer(self, status: int, data: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler

    def __enter__(self) -> ThrottlingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
