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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from remediation.config import RunnerConfig
from remediation.cordon_sync import CordonSync, KubeNodes, SlurmCli, SyncJournal
from remediation.dead_nodes import DeadNodes
from remediation.lender import KubeLending, Lender, SlurmLending
from remediation.lending import Demand, Policy
from remediation.metrics import Metrics
from remediation.notify import SpareShortage
from remediation.spares import KubePools, SpareKeeper, default_namespace, journal_path

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


def _spare_keeper(
    cfg: RunnerConfig,
    slurm_conf: Path | None,
    leading: Callable[[], bool],
    metrics: Metrics | None,
    shortage: SpareShortage | None,
) -> SpareKeeper | None:
    s = cfg.spare_keeper
    if not s.enabled or cfg.kubeconfig is None:
        return None

    def report(pool: str, spares: int, declared: int) -> None:
        if metrics is not None:
            metrics.pool_spares.labels(pool=pool).set(spares)
            metrics.pool_spares_declared.labels(pool=pool).set(declared)
        if shortage is not None:
            shortage.level(pool, spares, declared)

    def count(verb: str) -> None:
        if metrics is not None:
            metrics.spare_keeper_actions.labels(action=verb).inc()

    return SpareKeeper(
        KubePools(cfg.kubeconfig),
        SlurmCli(slurm_conf),
        SyncJournal(journal_path(s.journal_path, cfg.state_dir, "spare-keeper.jsonl")),
        default_namespace(s.namespace),
        cfg.opt_out_label,
        interval=s.interval_seconds,
        leading=leading,
        report=report,
        count=count,
    )


def _dead_nodes(
    cfg: RunnerConfig, slurm_conf: Path | None, leading: Callable[[], bool], metrics: Metrics | None
) -> DeadNodes | None:
    d = cfg.dead_nodes
    if not d.enabled or cfg.kubeconfig is None:
        return None
    counter = metrics.dead_nodes_deleted if metrics is not None else None
    return DeadNodes(
        KubeNodes(cfg.kubeconfig),
        SlurmCli(slurm_conf),
        SyncJournal(journal_path(d.journal_path, cfg.state_dir, "dead-nodes.jsonl")),
        grace=d.grace_seconds,
        interval=d.interval_seconds,
        leading=leading,
        deleted=lambda node: counter.inc() if counter is not None else None,
    )


def _lender(
    cfg: RunnerConfig,
    slurm_conf: Path | None,
    leading: Callable[[], bool],
    metrics: Metrics | None,
    notify: Callable[..., None] | None,
) -> Lender | None:
    c = cfg.lending
    if not c.enabled or cfg.kubeconfig is None:
        return None
    policy = Policy(
        max_nodes=c.max_nodes,
        max_percent=c.max_percent,
        min_training=c.min_training,
        cooldown=c.cooldown_seconds,
        return_after=c.return_after_seconds,
        grace=c.grace_seconds,
        on_grace=c.on_grace,
        order=tuple(c.order),
        pools=frozenset(c.pools),
        paused=c.paused,
    )

    def report(states: Mapping[str, int], demand: Demand) -> None:
        if metrics is not None:
            for state, n in states.items():
                metrics.lending_nodes.labels(state=state).set(n)
            metrics.lending_pending_gpus.set(demand.gpus)

    def count(verb: str) -> None:
        if metrics is not None:
            metrics.lending_moves.labels(move=verb).inc()

    return Lender(
        KubeLending(cfg.kubeconfig),
        SlurmLending(slurm_conf),
        SyncJournal(journal_path(c.journal_path, cfg.state_dir, "lending.jsonl")),
        policy,
        c.priority_class,
        cfg.opt_out_label,
        event_namespace=c.event_namespace,
        dry_run=c.dry_run,
        interval=c.interval_seconds,
        leading=leading,
        notify=notify or (lambda event, **fields: None),
        count=count,
        report=report,
    )


@dataclass
class ClusterSide:
    """Readiness checks, the cordon sync, and the leader's fleet loops (the spare keeper, dead
    nodes leaving Slurm); `problems()` is what /readyz reports."""

    kubeconfig: Path | None
    slurm_conf: Path | None
    checks: bool
    sync: CordonSync | None = None
    ttl: float = 5.0
    keeper: SpareKeeper | None = None
    reaper: DeadNodes | None = None
    lender: Lender | None = None
    _cached: tuple[float, list[str]] = (float("-inf"), [])
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_config(
        cls,
        cfg: RunnerConfig,
        *,
        leading: Callable[[], bool] = lambda: False,
        metrics: Metrics | None = None,
        shortage: SpareShortage | None = None,
        notify: Callable[..., None] | None = None,
    ) -> ClusterSide:
        """`leading`: whether this replica may act on the fleet now (the worker's leadership; a
        runner without a worker never does)."""
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
        keeper = _spare_keeper(cfg, slurm_conf, leading, metrics, shortage)
        reaper = _dead_nodes(cfg, slurm_conf, leading, metrics)
        lender = _lender(cfg, slurm_conf, leading, metrics, notify)
        return cls(
            cfg.kubeconfig, slurm_conf, cfg.cluster_checks, sync, keeper=keeper, reaper=reaper, lender=lender
        )

    def _loops(self) -> list[CordonSync | SpareKeeper | DeadNodes | Lender]:
        return [x for x in (self.sync, self.keeper, self.reaper, self.lender) if x is not None]

    def start(self) -> None:
        for loop in self._loops():
            loop.start()

    def stop(self) -> None:
        for loop in self._loops():
            loop.stop()

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
            names = {
                "cordon sync": self.sync,
                "spare keeper": self.keeper,
                "dead nodes": self.reaper,
                "lender": self.lender,
            }
            found += [f"{n}: {x.last_error}" for n, x in names.items() if x is not None and x.last_error]
            self._cached = (time.monotonic(), found)
            return list(found)
