"""Helpers for the runner's tests: a config in a tmp dir, payload builders, waiting.

(Named uniquely so pytest's rootdir imports cannot collide with other test folders.)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from remediation.config import RunnerConfig, parse_config
from remediation.states import IncidentState

HERE = Path(__file__).parent
PLAYBOOKS = HERE / "playbooks"
# A verbatim copy of shared/fixtures/alertmanager-0.25-webhook-v4-firing.json (a real payload
# captured from Alertmanager 0.25), kept here so the tests do not depend on where shared/ is.
FIXTURE = HERE / "fixtures" / "alertmanager-0.25-webhook-v4-firing.json"
TOKEN = "s3cret-token-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

RULES: list[dict[str, Any]] = [
    {
        "name": "test rules",
        "hosts": "all",
        "rules": [
            {
                "name": "GPU fatal XID",
                "condition": 'event.alert.labels.alertname == "GpuXidFatal"',
                "action": {
                    "run_playbook": {
                        "name": "playbooks/gpu_fatal_xid.yml",
                        "extra_vars": {
                            "autoheal_grace_seconds": 5,
                            "autoheal_routing": {
                                "node_labels": ["node", "Hostname"],
                                "fault_class": "gpu-fatal",
                            },
                        },
                    }
                },
                "throttle": {
                    "once_within": "15 minutes",
                    "group_by_attributes": ["event.alert.labels.Hostname"],
                },
            },
            {
                "name": "GPU fatal XID rehearsal",
                "condition": 'event.alert.labels.alertname == "GpuXidRehearsal"',
                "action": {
                    "run_playbook": {
                        "name": "gpu_fatal_xid.yml",
                        "extra_vars": {"autoheal_routing": {"dry_run": True}},
                    }
                },
            },
        ],
    }
]


def write_config(tmp: Path, **overrides: Any) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "token").write_text(TOKEN + "\n")
    (tmp / "rules.yaml").write_text(yaml.safe_dump(RULES))
    data: dict[str, Any] = {
        "listen_port": 0,
        "token_file": "token",
        "journal_path": "journal.sqlite",
        "rules_file": "rules.yaml",
        "playbook_dir": str(PLAYBOOKS),
        "state_dir": "state",
        "batch_window_seconds": 0.05,
        "poll_seconds": 0.1,
        "budgets": {"max_nodes": 5, "max_pool_percent": 50},
        "step_timeout_seconds": 60,
        "run_timeout_seconds": 120,
    }
    data.update(overrides)
    path = tmp / "runner.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def make_config(tmp: Path, **overrides: Any) -> RunnerConfig:
    path = write_config(tmp, **overrides)
    return parse_config(yaml.safe_load(path.read_text()), str(path), tmp, env={})


def alert(
    node: str = "gpu-1",
    xid: int | str = 79,
    gpu: int | str = 3,
    status: str = "firing",
    fingerprint: str | None = None,
    starts_at: str = "2026-11-30T03:46:01.103Z",
    alertname: str = "GpuXidFatal",
    **labels: str,
) -> dict[str, Any]:
    lab = {
        "alertname": alertname,
        "Hostname": node,
        "xid": str(xid),
        "gpu": str(gpu),
        "severity": "critical",
        **labels,
    }
    fp = fingerprint or format(abs(hash((node, str(xid), str(gpu), alertname))) % (1 << 60), "x")
    return {
        "status": status,
        "labels": lab,
        "annotations": {"summary": f"XID {xid} on {node}"},
        "startsAt": starts_at,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T04:00:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fp,
    }


def payload(*alerts: dict[str, Any], status: str | None = None) -> dict[str, Any]:
    base = json.loads(FIXTURE.read_text())
    base = copy.deepcopy(base)
    base["alerts"] = list(alerts)
    base["status"] = status or ("firing" if any(a["status"] == "firing" for a in alerts) else "resolved")
    return base


def effect_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_pid(proc: Any, timeout: float = 10.0) -> None:
    """Stop a process we started (a subprocess.Popen), by its PID: TERM, then KILL."""
    import subprocess

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def open_incident(
    tx: Any,
    node: str = "gpu-1",
    state: IncidentState = IncidentState.PENDING,
    extra_vars: dict[str, Any] | None = None,
) -> str:
    """An XID 79 incident created straight in the journal (journal-level tests)."""
    return str(
        tx.create_incident(
            node=node,
            gpu=0,
            xid=79,
            fault_class="gpu-fatal",
            tier="replace",
            fingerprint="ab",
            rule="r",
            playbook="gpu_fatal_xid.yml",
            extra_vars=extra_vars or {},
            rule_dry_run=False,
            state=state,
        )
    )


AM_BIN = "/usr/bin/prometheus-alertmanager"  # Debian's package


class Alertmanager:
    """Debian's Alertmanager as a child process, one route to the runner's webhook (bearer token
    from a credentials file, resolved notifications on). kill() and start() again make an outage:
    the storage folder (its notification log and silences) is kept, the alerts in memory are not,
    as with a real crash."""

    def __init__(self, folder: Path, webhook_url: str, token_file: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.proc: Any = None
        self.starts = 0
        folder.mkdir(parents=True, exist_ok=True)
        route = {
            "receiver": "autoheal",
            "group_by": ["Hostname", "alertname"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        }
        hook = {
            "url": webhook_url,
            "send_resolved": True,
            "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
        }
        config = {"route": route, "receivers": [{"name": "autoheal", "webhook_configs": [hook]}]}
        (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        import subprocess

        import httpx

        from tests.support import wait_for

        log = (self.folder / f"alertmanager-{self.starts}.log").open("wb")
        self.starts += 1
        self.proc = subprocess.Popen(
            [
                AM_BIN,
                f"--config.file={self.folder / 'alertmanager.yml'}",
                f"--storage.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

        def ready() -> bool:
            assert self.proc.poll() is None, (self.folder / f"alertmanager-{self.starts - 1}.log").read_text()
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "alertmanager to be ready")

    def kill(self) -> None:
        """SIGKILL, as a node failure or the OOM killer would (no snapshot of its state)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            stop_pid(self.proc)

    def post(self, labels: dict[str, str], starts: str, ends: str | None = None) -> None:
        """What Prometheus or the XID watcher send: one alert, raising if Alertmanager is away."""
        import httpx

        body: dict[str, Any] = {
            "labels": labels,
            "annotations": {"summary": "XID"},
            "startsAt": starts,
            "generatorURL": "http://prometheus/graph",
        }
        if ends is not None:
            body["endsAt"] = ends
        r = httpx.post(f"{self.url}/api/v2/alerts", json=[body], timeout=5)
        r.raise_for_status()
