"""The lab's real Prometheus and Alertmanager, loaded with the rules and routes autoheal ships.

Both run from Debian's packages with their own config and data directories on loopback ports;
Alertmanager's gossip is turned off (`--cluster.listen-address=`) so labs never find each other.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import httpx
import yaml

from autoheal.errors import LabError
from autoheal.faults import FaultCatalog, load_fault_catalog
from autoheal.monitoring import (
    render_alertmanager_config,
    render_degraded_rules,
    render_prometheus_config,
    render_xid_rules,
)
from lab import procs
from lab.config import LabConfig

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"
# the degraded-node rules hold for minutes in production (fault_catalog.yaml's sustain_seconds);
# the lab's for seconds, as its watchers' alerts are short-lived
LAB_SUSTAIN_S = 3


def lab_fault_catalog() -> FaultCatalog:
    """The shipped fault catalogue with every sustain cut to LAB_SUSTAIN_S at most."""
    cat = load_fault_catalog()
    short = tuple(
        f.model_copy(update={"sustain_seconds": min(f.sustain_seconds, LAB_SUSTAIN_S)}) for f in cat.faults
    )
    return cat.model_copy(update={"faults": short})


def check_installed() -> None:
    for binary, pkg in ((PROMETHEUS, "prometheus"), (ALERTMANAGER, "prometheus-alertmanager")):
        if shutil.which(binary) is None:
            raise LabError(f"{binary}: not installed (Debian package {pkg}); run scripts/bootstrap.sh")


def write_config(cfg: LabConfig) -> None:
    d = cfg.run_dir / "monitoring"
    d.mkdir(parents=True, exist_ok=True)
    token = cfg.run_dir / "runner.token"
    if not token.exists():
        import secrets

        token.write_text(secrets.token_urlsafe(32))
        token.chmod(0o600)
    (d / "xid.rules.yml").write_text(yaml.safe_dump(render_xid_rules(), sort_keys=False))
    degraded = render_degraded_rules(lab_fault_catalog())
    (d / "degraded.rules.yml").write_text(yaml.safe_dump(degraded, sort_keys=False))
    prom = render_prometheus_config(
        [str(d / "xid.rules.yml"), str(d / "degraded.rules.yml")],
        [f"127.0.0.1:{cfg.port('simulator')}"],
        f"127.0.0.1:{cfg.port('alertmanager')}",
        interval=cfg.interval,
    )
    if cfg.runner and not cfg.pods:  # the runner's own metrics, as a user's Prometheus scrapes them
        targets = [f"127.0.0.1:{cfg.port(s)}" for s in cfg.runner_services]
        runner_job = {"job_name": "autoheal-runner", "static_configs": [{"targets": targets}]}
        prom["scrape_configs"].append(runner_job)
    (d / "prometheus.yml").write_text(yaml.safe_dump(prom, sort_keys=False))
    am = alertmanager_config(cfg, token)
    (d / "alertmanager.yml").write_text(yaml.safe_dump(am, sort_keys=False))


def alertmanager_config(cfg: LabConfig, token: Path) -> dict[str, Any]:
    """The shipped Alertmanager config, its webhook receiver posting to every URL of
    `cfg.webhook_urls`: one webhook_config per runner replica (each alert reaches every replica;
    their shared journal deduplicates it), or the one `webhook_url` given."""
    urls = cfg.webhook_urls
    am = render_alertmanager_config(urls[0], str(token))
    for receiver in am["receivers"]:
        configs = receiver.get("webhook_configs")
        if configs:
            receiver["webhook_configs"] = [{**copy.deepcopy(configs[0]), "url": url} for url in urls]
    return am


def start_prometheus(cfg: LabConfig) -> None:
    port = cfg.port("prometheus")
    d = cfg.run_dir / "monitoring"
    procs.start_service(
        "prometheus",
        [
            PROMETHEUS,
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            f"--web.external-url=http://127.0.0.1:{port}",
        ],
        cfg.run_dir,
        port=port,
        ready=procs.http_ok(cfg.url("prometheus", "/-/ready")),
        timeout=30,
    )


def start_alertmanager(cfg: LabConfig) -> None:
    port = cfg.port("alertmanager")
    d = cfg.run_dir / "monitoring"
    procs.start_service(
        "alertmanager",
        [
            ALERTMANAGER,
            f"--config.file={d / 'alertmanager.yml'}",
            f"--storage.path={d / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            f"--web.external-url=http://127.0.0.1:{port}",
        ],
        cfg.run_dir,
        port=port,
        ready=procs.http_ok(cfg.url("alertmanager", "/-/ready")),
        timeout=30,
    )


def start_bridge(cfg: LabConfig, gateway: str) -> None:
    """Alertmanager's API on the lab bridge as well (a forwarder to its loopback port), for the
    XID watchers that run as pods on a pods lab's nodes; the host's own callers keep loopback."""
    import socket
    import sys

    port = cfg.port("alertmanager")
    argv = [
        sys.executable,
        "-m",
        "lab.nodes.apiproxy",
        f"--listen={gateway}:{port}",
        f"--to=127.0.0.1:{port}",
    ]
    proc = procs.spawn("alertmanager-bridge", argv, cfg.run_dir)

    def listening() -> bool:
        with socket.create_connection((gateway, port), timeout=1):
            return True

    procs.wait_until(listening, 15, "alertmanager-bridge", proc)


def wait_pipeline(cfg: LabConfig, timeout: float = 30.0) -> None:
    """Ready means alerts can flow: the simulator scraped and Alertmanager discovered."""

    def ready() -> bool:
        t = httpx.get(cfg.url("prometheus", "/api/v1/targets"), timeout=2).json()["data"]
        scraped = any(x["health"] == "up" for x in t["activeTargets"])
        am = httpx.get(cfg.url("prometheus", "/api/v1/alertmanagers"), timeout=2).json()["data"]
        return scraped and bool(am["activeAlertmanagers"])

    procs.wait_until(ready, timeout, "prometheus (scrape of the simulator, alertmanager discovery)")
