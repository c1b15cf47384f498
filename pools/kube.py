"""What pool backends read of Kubernetes Nodes: the machine behind a node (`spec.providerID`),
whether it is Ready, its boot id (a reboot changes it) and its pool label.

Through the `kubernetes` client: a kubeconfig when one is given, else the pod's service account
(in-cluster), else the default kubeconfig.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from autoheal import labels as lb
from pools.base import BackendError


@dataclass(frozen=True)
class NodeView:
    """The parts of one Node a backend acts on."""

    name: str
    provider_id: str
    ready: bool
    boot_id: str
    pool: str
    unschedulable: bool = False  # cordoned: the runbook fences a node before it is retired


def core_api(kubeconfig: str | None = None) -> Any:
    """A CoreV1Api on the cluster: `kubeconfig`, else in-cluster, else ~/.kube/config."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg, persist_config=False)
        else:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except config.ConfigException:
                config.load_kube_config(client_configuration=cfg, persist_config=False)
    except (OSError, config.ConfigException) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster or ~/.kube/config"
        raise BackendError(
            f"no Kubernetes access through {where} ({exc}): pass --kubeconfig, or run in a pod"
            " with a service account"
        ) from exc
    return client.CoreV1Api(client.ApiClient(cfg))


def view(node: Any) -> NodeView:
    """A NodeView of a `kubernetes` V1Node."""
    status = node.status
    ready = any(c.type == "Ready" and c.status == "True" for c in (status.conditions or []) if status)
    info = status.node_info if status else None
    return NodeView(
        name=node.metadata.name,
        provider_id=(node.spec.provider_id or "") if node.spec else "",
        ready=ready,
        boot_id=(info.boot_id or "") if info else "",
        pool=(node.metadata.labels or {}).get(lb.POOL_LABEL, ""),
        unschedulable=bool(node.spec and node.spec.unschedulable),
    )


def read_nodes(api: Any, names: Iterable[str]) -> dict[str, NodeView | None]:
    """Each named Node, or None for one that does not exist."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    found: dict[str, NodeView | None] = {}
    for name in names:
        try:
            found[name] = view(api.read_node(name))
        except ApiException as exc:
            if exc.status != 404:
                raise BackendError(
                    f"reading Node {name}: HTTP {exc.status} {exc.reason}{_hint(exc)}"
                ) from exc
            found[name] = None
        except HTTPError as exc:
            raise BackendError(f"reading Node {name}: the Kubernetes API is unreachable ({exc})") from exc
    return found


def list_nodes(api: Any) -> list[NodeView]:
    """Every Node of the cluster."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return [view(n) for n in api.list_node().items]
    except ApiException as exc:
        raise BackendError(f"listing Nodes: HTTP {exc.status} {exc.reason}{_hint(exc)}") from exc
    except HTTPError as exc:
        raise BackendError(f"listing Nodes: the Kubernetes API is unreachable ({exc})") from exc


def _hint(exc: Any) -> str:
    return " (RBAC: the runner's ClusterRole must get and list nodes)" if exc.status == 403 else ""
