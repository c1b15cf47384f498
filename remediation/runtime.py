"""Wiring: build the journal, rules, policy, executor, worker and app from one RunnerConfig.

Kept apart from app.py so the CLI, the tests and the benchmark assemble the runner the same way.
"""

from __future__ import annotations

import os

from autoheal.xid import load_catalog
from remediation.app import Runtime
from remediation.auth import load_token
from remediation.committer import GroupCommitter
from remediation.config import RunnerConfig
from remediation.errors import RunnerConfigError
from remediation.executor import Executor
from remediation.fencing import JournalFence
from remediation.incidents import Intake
from remediation.journal import Journal
from remediation.kubeview import KubeView, make_kube
from remediation.leader import KubeLeaseAPI, LeaseElector, Term, default_identity
from remediation.metrics import Metrics
from remediation.notify import Notifier
from remediation.policy import Policy
from remediation.rules import load_rules
from remediation.warmfence import WarmFence
from remediation.worker import Worker


def make_executor(cfg: RunnerConfig) -> Executor:
    return Executor(
        cfg.playbook_dir,
        cfg.state_dir,
        step_timeout=cfg.step_timeout_seconds,
        run_timeout=cfg.run_timeout_seconds,
        python=cfg.ansible_python,
    )


def make_warm_fence(cfg: RunnerConfig) -> WarmFence | None:
    """The warm fence, where the playbook directory sits in a data root with the collection."""
    root = cfg.playbook_dir.parent
    if not cfg.warm_fence or not (root / "collections" / "ansible_collections").is_dir():
        return None
    return WarmFence(root, timeout=float(cfg.step_timeout_seconds), processes=cfg.max_concurrent_fences)


def make_elector(cfg: RunnerConfig, worker: Worker, metrics: Metrics) -> LeaseElector:
    """The Lease campaign of this replica; its changes drive the worker (remediation/leader.py)."""
    le = cfg.leader_election
    if cfg.kubeconfig is None:
        raise RunnerConfigError(
            "leader_election.enabled needs the cluster: set kubeconfig, or in_cluster: true in a pod"
        )
    namespace = le.namespace or os.environ.get("POD_NAMESPACE") or "autoheal"

    def started(term: Term) -> None:
        metrics.leader.set(1)
        metrics.leader_changes.labels(change="started").inc()
        worker.lead(term)

    def stopped() -> None:
        metrics.leader.set(0)
        metrics.leader_changes.labels(change="stopped").inc()
        worker.depose()

    return LeaseElector(
        KubeLeaseAPI(cfg.kubeconfig, namespace, le.lease_name),
        le.identity or default_identity(),
        lease_seconds=le.lease_duration_seconds,
        renew_deadline_seconds=le.renew_deadline_seconds,
        retry_seconds=le.retry_period_seconds,
        on_started=started,
        on_stopped=stopped,
    )


def build(cfg: RunnerConfig, *, kube: KubeView | None = None, with_worker: bool = True) -> Runtime:
    """Everything `serve` runs; `kube` replaces the configured cluster (tests use FakeKube)."""
    catalog = load_catalog()
    metrics = Metrics()
    journal = Journal.configured(cfg.journal_path, cfg.journal_dsn, metrics.count_illegal)
    rules = load_rules(cfg.rules_file)
    notifier = Notifier(cfg.notify, metrics)
    worker = None
    elector = None
    if with_worker:
        view = kube if kube is not None else make_kube(cfg.kubeconfig, cfg.pool_cache_seconds)
        fence = None
        worker_journal = journal
        if cfg.leader_election.enabled:
            # the worker writes through its own handle, guarded by the fencing token: a replica
            # that no longer leads cannot change an incident (remediation/fencing.py)
            fence = JournalFence(journal)
            worker_journal = Journal.configured(cfg.journal_path, cfg.journal_dsn, metrics.count_illegal)
            worker_journal.guard = fence.check
        policy = Policy(cfg, worker_journal, view, catalog)
        worker = Worker(
            cfg, worker_journal, policy, make_executor(cfg), metrics, notifier, make_warm_fence(cfg), fence
        )
        if fence is not None:
            elector = make_elector(cfg, worker, metrics)
    intake = Intake(journal, rules, catalog, cfg.dedup_window_seconds)
    return Runtime(
        config=cfg,
        journal=journal,
        intake=intake,
        committer=GroupCommitter(journal, intake),
        metrics=metrics,
        token=load_token(cfg.token_file),
        max_body_bytes=cfg.max_body_bytes,
        budget_limit=cfg.budgets.max_nodes,
        worker=worker,
        notifier=notifier,
        elector=elector,
    )
