"""One XID watcher per simulated GPU node, as the GpuMonitoring DaemonSet runs one per GPU node.

Each watcher is the real daemon (`python -m watcher`), reading its node's simulated kernel log
(lab.kernlog: a file of kmsg records) and nvidia-smi CSV, posting to the lab's Alertmanager. The
lab starts them with the rest; the pool controller starts one for each replacement node and stops
a retired node's. A lab larger than WATCHER_MAX_NODES (the 2,000-node storm labs) starts none:
a Python process per node would not fit two cores, and those benches measure the runner.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lab import procs
from lab.config import LabConfig

WATCHER_MAX_NODES = 64


def kmsg_dir(cfg: LabConfig) -> Path:
    """Where the simulator keeps each node's kernel log and nvidia-smi view (lab.kernlog)."""
    return cfg.run_dir / "gpunodes"


def name(node: str) -> str:
    return f"watcher-{node}"


def enabled(cfg: LabConfig) -> bool:
    return cfg.watchers and cfg.node_count <= WATCHER_MAX_NODES


def start(cfg: LabConfig, nodes: list[str]) -> list[str]:
    """Start the watchers of `nodes` (those not running yet); returns the names started. They
    read from the start of their kernel log (first start: a 300 s replay window), so a fault
    injected before a watcher is up is still seen."""
    if not enabled(cfg):
        return []
    running = procs.running(cfg.run_dir)
    started = []
    for node in nodes:
        if name(node) in running:
            continue
        d = kmsg_dir(cfg) / node
        procs.spawn(
            name(node),
            [
                sys.executable,
                "-m",
                "watcher",
                f"--node={node}",
                "--source=kmsg",
                f"--path={d / 'kmsg'}",
                f"--gpu-map=file:{d / 'gpus.csv'}",
                f"--alertmanager={cfg.url('alertmanager')}",
                f"--state={cfg.run_dir / 'watchers' / f'{node}.json'}",
                # the node's simulated sysfs (lab.kernlog: an InfiniBand port, the GPUs' PCIe links)
                f"--sysfs-root={d / 'sys'}",
                "--link-poll-seconds=0.5",
                # the lab injects, clears and injects again within minutes: short-lived alerts
                "--resend-seconds=5",
                "--hold-seconds=20",
            ],
            cfg.run_dir,
        )
        started.append(name(node))
    return started


def stop(cfg: LabConfig, node: str) -> bool:
    return procs.stop(cfg.run_dir, name(node))
