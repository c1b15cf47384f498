"""What the runner in a pod keeps up beside the plays: readiness checks of the two systems it
acts on, and the cordon sync (remediation.cordon_sync), built from the runner's config.

`/readyz` answers 503 naming the cause when the runner could not do its job: the API server
refuses or does not answer its ServiceAccount (a list of one node, the cheapest call that proves
both authentication and the RBAC binding), or slurmctld does not answer `scontrol ping` (wrong
slurm.conf, no munge, a controller down or of an incompatible version). Results are cached for
`ttl` seconds so a probe every few seconds costs one check, not one per probe. Both checks are
off by default (`cluster_checks`): a host-process runner in the lab or a test has no pod to
take out of a Service; the RemediationRunner component turns them on.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from remediation.config import RunnerConfig
from remediation.cordon_sync import CordonSync, KubeNodes, SlurmCli, SyncJournal

PROBE_TIMEOUT_S = 5.0


def slurm_conf_of(cfg: RunnerConfig) -> Path | None:
    """The slurm.conf the plays use (the runbook input), for the runner's own Slurm calls too."""
    value = cfg.play_vars.get("autoheal_slurm_conf")
    return Path(value) if isinstance(value, str) and value else None


def check_api_server(kubeconfig: Path | None) -> str | None:
    """None when the API server answers our identity a node list; else the cause."""
    if kubeconfig is None:
        return "Kubernetes: no kubeconfig and not in a pod (cordon, drain and opt-out are off)"
    from kubernetes import client, config

    try:
        api = config.new_client_from_config(config_file=str(kubeconfig))
        with api:
            client.CoreV1Api(api).list_node(limit=1, _request_timeout=PROBE_TIMEOUT_S, _preload_content=False)
    except client.exceptions.ApiException as exc:
        return f"Kubernetes API server refused listing nodes: {exc.status} {exc.reason}"
    except Exception as exc:
        return f"Kubernetes API server unreachable ({kubeconfig}): {type(exc).__name__}: {exc}"
    return None


def check_slurmctld(slurm_conf: Path | None) -> str | None:
    """None when `scontrol ping` finds slurmctld UP; else its own words."""
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    try:
        res = subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S + 5
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"slurmctld: scontrol ping failed: {exc}"
    out = " ".join((res.stdout + " " + res.stderr).split())
    if res.returncode != 0 or "is UP" not in out:
        return f"slurmctld not reachable (SLURM_CONF={env.get('SLURM_CONF', 'default')}): {out[:300]}"
    return None


@dataclass
class ClusterSide:
    """Readiness checks and the cordon sync; `problems()` is what /readyz reports."""

    kubeconfig: Path | None
    slurm_conf: Path | None
    checks: bool
    sync: CordonSync | None = None
    ttl: float = 5.0
    _cached: tuple[float, list[str]] = (float("-inf"), [])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_config(cls, cfg: RunnerConfig) -> ClusterSide:
        slurm_conf = slurm_conf_of(cfg)
        sync = None
        s = cfg.cordon_sync
        if s.enabled and cfg.kubeconfig is not None:
            journal = SyncJournal(s.journal_path or cfg.state_dir / "cordon-sync.jsonl")
            sync = CordonSync(
                KubeNodes(cfg.kubeconfig),
                SlurmCli(slurm_conf),
                journal,
                ignore=s.ignore_taints,
                resync_seconds=s.resync_seconds,
            )
        return cls(cfg.kubeconfig, slurm_conf, cfg.cluster_checks, sync)

    def start(self) -> None:
        if self.sync is not None:
            self.sync.start()

    def stop(self) -> None:
        if self.sync is not None:
            self.sync.stop()

    def problems(self) -> list[str]:
        """Why the runner is not ready (empty: ready); checked at most once per `ttl`."""
        with self._lock:
            at, found = self._cached
            if time.monotonic() - at < self.ttl:
                return list(found)
            found = []
            if self.checks:
                found += [
                    p for p in (check_api_server(self.kubeconfig), check_slurmctld(self.slurm_conf)) if p
                ]
            if self.sync is not None and self.sync.last_error is not None:
                found.append(f"cordon sync: {self.sync.last_error}")
            self._cached = (time.monotonic(), found)
            return list(found)
