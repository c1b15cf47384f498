"""What the policy needs from Kubernetes, behind a small interface.

Only two reads: every node with its labels (opt-out label, pool membership) and the nodes that run
a pod carrying the opt-out label. Both are one list call each per policy round, not one call per
node, so a storm of hundreds of alerts costs two API calls. `FakeKube` serves unit tests;
`RealKube` uses the `kubernetes` client with a kubeconfig; `NullKube` stands in when no cluster is
configured (nothing is opted out and pools are unknown, so only the node budget applies).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from remediation.errors import KubeError

_FALSE = frozenset({"false", "no", "0", "off"})


def label_is_set(labels: Mapping[str, str], key: str) -> bool:
    """An opt-out label counts when present with any value but an explicit false."""
    return key in labels and labels[key].strip().lower() not in _FALSE


class KubeView(Protocol):
    def node_labels(self) -> dict[str, dict[str, str]]:
        """Every node's labels, by node name ({} when no cluster is known)."""
        ...

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        """Names of nodes running at least one pod on which `label` is set."""
        ...


class NullKube:
    def node_labels(self) -> dict[str, dict[str, str]]:
        return {}

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        return set()


class FakeKube:
    """In-memory nodes and pods for tests."""

    def __init__(
        self,
        nodes: Mapping[str, Mapping[str, str]] | None = None,
        pods: Iterable[tuple[str, Mapping[str, str]]] = (),
    ) -> None:
        self.nodes = {n: dict(labels) for n, labels in (nodes or {}).items()}
        self.pods = [(node, dict(labels)) for node, labels in pods]
        self.calls = 0

    def node_labels(self) -> dict[str, dict[str, str]]:
        self.calls += 1
        return {n: dict(labels) for n, labels in self.nodes.items()}

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        self.calls += 1
        return {node for node, labels in self.pods if label_is_set(labels, label)}


class RealKube:
    """Reads the cluster through the official client, with a kubeconfig file."""

    def __init__(self, kubeconfig: Path, timeout_seconds: float = 10.0) -> None:
        from kubernetes import client, config

        try:
            api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig)
            )
        except Exception as exc:
            raise KubeError(f"kubeconfig {kubeconfig}: cannot load: {exc}") from exc
        self._core: Any = client.CoreV1Api(api_client)
        self._timeout = timeout_seconds

    def node_labels(self) -> dict[str, dict[str, str]]:
        try:
            nodes = self._core.list_node(_request_timeout=self._timeout)
        except Exception as exc:
            raise KubeError(f"cannot list nodes: {exc}") from exc
        return {n.metadata.name: dict(n.metadata.labels or {}) for n in nodes.items}

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        try:
            pods = self._core.list_pod_for_all_namespaces(
                label_selector=label, _request_timeout=self._timeout
            )
        except Exception as exc:
            raise KubeError(f"cannot list pods with label {label}: {exc}") from exc
        return {
            p.spec.node_name
            for p in pods.items
            if p.spec.node_name and label_is_set(p.metadata.labels or {}, label)
        }


def make_kube(kubeconfig: Path | None) -> KubeView:
    return NullKube() if kubeconfig is None else RealKube(kubeconfig)
