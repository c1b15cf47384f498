"""The remediation runner as a lab service: the same `autoheal serve` a cluster runs, pointed at
the lab's Slurm, Kubernetes API, pool controller and the repository's playbooks.

Lab-specific play inputs (slurm.conf path, kubeconfig, which replacement backend) travel as the
runner's `play_vars`, so the playbooks and the rules file are exactly the shipped ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from autoheal.paths import data_root
from lab import procs
from lab.config import LabConfig

REPO = data_root()


def runner_dir(cfg: LabConfig) -> Path:
    return cfg.run_dir / "runner"


def config_path(cfg: LabConfig) -> Path:
    return runner_dir(cfg) / "runner.yaml"


def journal_path(cfg: LabConfig) -> Path:
    return runner_dir(cfg) / "journal.sqlite"


def write_config(cfg: LabConfig, overrides: dict[str, Any] | None = None) -> Path:
    d = runner_dir(cfg)
    d.mkdir(parents=True, exist_ok=True)
    play_vars: dict[str, Any] = {
        "autoheal_slurm_conf": str(cfg.slurm_conf),
        "autoheal_lab_name": cfg.name,
        "autoheal_lab_root": str(cfg.root),
        "autoheal_backend": "lab",
        "autoheal_grace_seconds": cfg.grace_seconds,
        # the recovery ladder's bundles for the vendor (issue 15), beside the runner's journal
        "autoheal_evidence_dir": str(d / "evidence"),
    }
    if cfg.kubeconfig.exists():
        play_vars["autoheal_kubeconfig"] = str(cfg.kubeconfig)
    pool_size = sum(p.size + p.spares for p in cfg.pools)
    conf: dict[str, Any] = {
        "listen_host": "127.0.0.1",
        "listen_port": cfg.port("runner"),
        "token_file": str(cfg.run_dir / "runner.token"),
        "journal_path": str(journal_path(cfg)),
        "rules_file": str(REPO / "config" / "rules.yaml"),
        "playbook_dir": str(REPO / "playbooks"),
        "state_dir": str(d / "state"),
        "kubeconfig": str(cfg.kubeconfig) if cfg.kubeconfig.exists() else None,
        "grace_seconds": cfg.grace_seconds,
        "ansible_python": sys.executable,
        # the lab's pool is small: let one incident at a time through, as the default budget does
        "budgets": {"max_nodes": max(1, pool_size // 3), "max_pool_percent": 34},
        "play_vars": play_vars,
    }
    conf.update(overrides or {})
    path = config_path(cfg)
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


def start(cfg: LabConfig, overrides: dict[str, Any] | None = None) -> None:
    path = write_config(cfg, overrides)
    cli = Path(sys.executable).with_name("autoheal")
    procs.start_service(
        "runner",
        [str(cli), "serve", "--config", str(path)],
        cfg.run_dir,
        port=cfg.port("runner"),
        ready=procs.http_ok(cfg.url("runner", "/readyz")),
        timeout=30,
        env={"AUTOHEAL_LAB_ROOT": str(cfg.root), "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        cwd=REPO,
    )
