"""What the policy needs from Kubernetes, behind a small interface.

Three reads for the policy, none of which grows with the size of the cluster for an ordinary incident:
- the nodes that carry the opt-out label (a label-selected list: on a healthy fleet, a handful);
- the nodes that run a pod carrying the opt-out label (same, for pods);
- which pool each node belongs to, for the per-pool budget. Pool membership changes when nodes are
  added or retired, not per incident, so this map is cached for `pool_cache_seconds` and refreshed
  early only when a node asked about is missing from it. On 2,000 nodes the full list costs seconds
  of apiserver and client CPU; listing it per policy round made one incident's cost grow with the
  fleet and delayed a storm's first fence by ~10 s (measured, bench/storm.py).
Lists ask for metadata only (PartialObjectMetadataList) and are parsed as plain JSON, not into the
generated client's model classes. Opt-out is always read fresh: a label set a second ago counts.
The fourth read serves the worker: nodes still labelled quarantined but schedulable again, i.e.
uncordoned by hand while their incident is open (docs/architecture.md, "Safety": that cancels the incident).

`FakeKube` serves unit tests; `RealKube` uses the `kubernetes` client with a kubeconfig; `NullKube`
stands in when no cluster is configured (nothing is opted out, pools are unknown, so only the
fleet-wide node budget applies).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from remediation.errors import KubeError

_FALSE = frozenset({"false", "no", "0", "off"})
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
# a node unknown to the cached pool map triggers a refresh, but not more often than this
MIN_REFRESH_SECONDS = 5.0


def label_is_set(labels: Mapping[str, str], key: str) -> bool:
    """An opt-out label counts when present with any value but an explicit false."""
    return key in labels and labels[key].strip().lower() not in _FALSE


class KubeView(Protocol):
    def nodes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        """Nodes on which `label` is present (any value), with all their labels."""
        ...

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        """Names of nodes running at least one pod on which `label` is set."""
        ...

    def pools(self, pool_label: str, nodes: Collection[str] = ()) -> dict[str, str]:
        """Node -> pool for every node carrying `pool_label`; may be cached, but is refreshed when
        one of `nodes` is missing from it."""
        ...

    def uncordoned(self, selector: str) -> set[str]:
        """Nodes matching the label `selector` (our quarantine label) that are schedulable again:
        someone uncordoned them by hand."""
        ...


class NullKube:
    def nodes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        return {}

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        return set()

    def pools(self, pool_label: str, nodes: Collection[str] = ()) -> dict[str, str]:
        return {}

    def uncordoned(self, selector: str) -> set[str]:
        return set()


class FakeKube:
    """In-memory nodes and pods for tests; `calls` counts reads like API calls."""

    def __init__(
        self,
        nodes: Mapping[str, Mapping[str, str]] | None = None,
        pods: Iterable[tuple[str, Mapping[str, str]]] = (),
    ) -> None:
        self.nodes = {n: dict(labels) for n, labels in (nodes or {}).items()}
        self.pods = [(node, dict(labels)) for node, labels in pods]
        self.schedulable: set[str] = set()  # nodes a test "uncordoned by hand"
        self.calls = 0

    def nodes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        self.calls += 1
        return {n: dict(labels) for n, labels in self.nodes.items() if label in labels}

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        self.calls += 1
        return {node for node, labels in self.pods if label_is_set(labels, label)}

    def pools(self, pool_label: str, nodes: Collection[str] = ()) -> dict[str, str]:
        self.calls += 1
        return {n: labels[pool_label] for n, labels in self.nodes.items() if pool_label in labels}

    def uncordoned(self, selector: str) -> set[str]:
        self.calls += 1
        key, _, value = selector.partition("=")
        return {n for n in self.schedulable if self.nodes.get(n, {}).get(key) == value}


class RealKube:
    """Reads the cluster through the official client, with a kubeconfig file."""

    def __init__(
        self, kubeconfig: Path, timeout_seconds: float = 10.0, pool_cache_seconds: float = 60.0
    ) -> None:
        from kubernetes import client, config

        try:
            api_client = config.new_client_from_config(config_file=str(kubeconfig))
        except Exception as exc:
            raise KubeError(f"kubeconfig {kubeconfig}: cannot load: {exc}") from exc
        self._core: Any = client.CoreV1Api(api_client)
        self._timeout = timeout_seconds
        self._pool_ttl = pool_cache_seconds
        self._pool_cache: dict[str, tuple[float, dict[str, str]]] = {}
        self._lock = threading.Lock()

    def _list(
        self, what: str, path: str, accept: str = "application/json", **query: str
    ) -> list[dict[str, Any]]:
        """GET a list as plain JSON (no model objects), with our own Accept header (the generated
        list_* methods overwrite it)."""
        try:
            resp = self._core.api_client.call_api(
                path,
                "GET",
                query_params=list(query.items()),
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            data = json.loads(resp.data)
        except Exception as exc:
            raise KubeError(f"cannot list {what}: {exc}") from exc
        items = data.get("items") if isinstance(data, dict) else None
        return [i for i in items or [] if isinstance(i, dict)]

    def _node_metadata(self, selector: str, **fields: str) -> dict[str, dict[str, str]]:
        what = f"nodes with label {selector}"
        items = self._list(what, "/api/v1/nodes", METADATA_ONLY, labelSelector=selector, **fields)
        out = {}
        for item in items:
            meta = item.get("metadata") or {}
            if isinstance(meta.get("name"), str):
                out[meta["name"]] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        return out

    def nodes_labelled(self, label: str) -> dict[str, dict[str, str]]:
        return self._node_metadata(label)

    def nodes_with_labelled_pods(self, label: str) -> set[str]:
        items = self._list(f"pods with label {label}", "/api/v1/pods", labelSelector=label)
        return {
            str(p["spec"]["nodeName"])
            for p in items
            if (p.get("spec") or {}).get("nodeName")
            and label_is_set((p.get("metadata") or {}).get("labels") or {}, label)
        }

    def pools(self, pool_label: str, nodes: Collection[str] = ()) -> dict[str, str]:
        with self._lock:
            now = time.monotonic()
            at, cached = self._pool_cache.get(pool_label, (float("-inf"), {}))
            stale = now - at > self._pool_ttl
            missing = any(n not in cached for n in nodes) and now - at > MIN_REFRESH_SECONDS
            if stale or missing:
                cached = {n: labels[pool_label] for n, labels in self._node_metadata(pool_label).items()}
                self._pool_cache[pool_label] = (now, cached)
            return dict(cached)

    def uncordoned(self, selector: str) -> set[str]:
        # one small list: only nodes still labelled quarantined whose cordon was lifted
        return set(self._node_metadata(selector, fieldSelector="spec.unschedulable=false"))


def make_kube(kubeconfig: Path | None, pool_cache_seconds: float = 60.0) -> KubeView:
    return NullKube() if kubeconfig is None else RealKube(kubeconfig, pool_cache_seconds=pool_cache_seconds)
