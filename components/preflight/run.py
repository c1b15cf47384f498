"""The whole preflight: the stack's kubeconfig, the reads, and every check in the report's order."""

from __future__ import annotations

import time
from pathlib import Path

from autoheal.errors import ConfigError
from components.config import PROJECT, StackSpec, resolve_path
from components.preflight.kube import CONNECT_TIMEOUT_S, Kube, Unreachable, kubeconfig_name, read_cluster
from components.preflight.model import Check, ClusterView, Report
from components.preflight.nodes import (
    check_access,
    check_kubelet_versions,
    check_node_os,
    check_server_version,
    check_system_nodes,
)
from components.preflight.pools import check_pool_nodes
from components.preflight.prometheus import check_prometheus_operator
from components.preflight.storage import check_storage


def _node_checks(cfg: StackSpec, view: ClusterView) -> list[Check]:
    return [
        check_kubelet_versions(view),
        check_node_os(view),
        *check_pool_nodes(cfg, view),
        *check_system_nodes(cfg, view),
    ]


def run_checks(cfg: StackSpec, view: ClusterView) -> list[Check]:
    """Every check, in the report's order. Without the right to list nodes, the checks of nodes
    are left out (the `read access` row says why) rather than reported as no nodes."""
    nodes_read = "nodes" not in view.denied
    return [
        *check_access(view),
        check_server_version(view),
        *(_node_checks(cfg, view) if nodes_read else []),
        *check_storage(cfg, view),
        *check_prometheus_operator(cfg, view),
    ]


def kubeconfig_of(cfg: StackSpec, root: Path) -> str:
    """The stack's kubeconfig as the program hands it to the provider (a path resolved against
    the project folder, or the kubeconfig's own text)."""
    value = cfg.cluster.kubeconfig
    if not value:
        raise ConfigError(f"{PROJECT}:cluster.kubeconfig: not set (backend {cfg.cluster.backend})")
    return value if "\n" in value else str(resolve_path(root, value))


def preflight(
    cfg: StackSpec,
    root: Path,
    stack: str = "",
    kubeconfig: str | None = None,
    context: str | None = None,
    connect_timeout: float = CONNECT_TIMEOUT_S,
) -> Report:
    """Every check of an existing cluster against the stack. `kubeconfig`/`context` override the
    stack's. An unreachable cluster is one failed check (the others are not run)."""
    t0 = time.monotonic()
    where = kubeconfig or kubeconfig_of(cfg, root)
    # another kubeconfig than the stack's comes without the stack's context
    ctx = context if context is not None or kubeconfig else cfg.cluster.context
    host, checks = _check_cluster(cfg, where, ctx, connect_timeout)
    return Report(
        stack=stack,
        server=host if host is not None else kubeconfig_name(where),  # no URL: name the kubeconfig
        checks=checks,
        seconds=time.monotonic() - t0,
    )


def _check_cluster(
    cfg: StackSpec, kubeconfig: str, context: str | None, connect_timeout: float
) -> tuple[str | None, list[Check]]:
    """(the API server's URL, None where the kubeconfig could not be loaded; the report's rows)."""
    try:
        kube = Kube(kubeconfig, context, connect_timeout=connect_timeout)
    except Unreachable as exc:
        return None, [
            Check(
                "cluster reachable",
                "fail",
                str(exc),
                "point cluster.kubeconfig at a kubeconfig for the cluster",
            )
        ]
    try:
        view = read_cluster(kube, cfg)
    except Unreachable as exc:
        return kube.host, [
            Check(
                "cluster reachable",
                "fail",
                f"{kube.host}: {exc}",
                "start the cluster or fix cluster.kubeconfig / cluster.context (is the API server up, "
                "and reachable from here: VPN, firewall, endpoint access?)",
            )
        ]
    finally:
        kube.close()
    reachable = Check("cluster reachable", "pass", f"{kube.host} answered ({len(view.nodes)} nodes)")
    return kube.host, [reachable, *run_checks(cfg, view)]
