"""Wiring: build the journal, rules, policy, executor, worker and app from one RunnerConfig.

Kept apart from app.py so the CLI, the tests and the benchmark assemble the runner the same way.
"""

from __future__ import annotations

from autoheal.xid import load_catalog
from remediation.app import Runtime
from remediation.auth import load_token
from remediation.committer import GroupCommitter
from remediation.config import RunnerConfig
from remediation.executor import Executor
from remediation.incidents import Intake
from remediation.journal import Journal
from remediation.kube import KubeView, make_kube
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
    return WarmFence(root, timeout=float(cfg.step_timeout_seconds))


def build(cfg: RunnerConfig, *, kube: KubeView | None = None, with_worker: bool = True) -> Runtime:
    """Everything `serve` runs; `kube` replaces the configured cluster (tests use FakeKube)."""
    catalog = load_catalog()
    metrics = Metrics()
    journal = Journal(cfg.journal_path, on_illegal=metrics.count_illegal)
    rules = load_rules(cfg.rules_file)
    notifier = Notifier(cfg.notify, metrics)
    worker = None
    if with_worker:
        view = kube if kube is not None else make_kube(cfg.kubeconfig, cfg.pool_cache_seconds)
        policy = Policy(cfg, journal, view, catalog)
        worker = Worker(cfg, journal, policy, make_executor(cfg), metrics, notifier, make_warm_fence(cfg))
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
    )
