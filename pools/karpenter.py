"""The Karpenter pool backend: a node's machine is its NodeClaim; retiring it deletes the NodeClaim.

- node -> NodeClaim: the NodeClaim whose `status.providerID` is the Node's own `spec.providerID`
  and whose `status.nodeName` is the node (never alert text); the delete carries a UID
  precondition, so a NodeClaim replaced in between (same name, new object) is never deleted;
- retire: Karpenter's termination finalizer drains and deletes the Node and terminates the
  instance; a static NodePool (`spec.replicas`, the StaticCapacity feature gate) launches the
  replacement at once, a dynamic one when pending pods need the capacity. A NodeClaim already
  deleting or gone is not deleted again (`changed=False`). `autoheal pool retire
  --wait-replacement` waits on health: the pool back at its replicas without the retired nodes;
- reboot: Karpenter has no reboot (a NodeClaim is replaced, never rebooted): every node answers
  ok=False with why, and the ladder climbs to retire;
- health: per pool (the NodePools whose template carries `autoheal.io/pool`, else the NodePool's
  name), the desired replicas and the NodeClaims launched, Ready, deleting; `ok` once as many
  NodeClaims as the static NodePools' replicas are initialized with a Ready Node (members: those
  Nodes; a deleting NodeClaim's Node is no member).

Through the `kubernetes` client (pools/kube.py): a kubeconfig, in-cluster, or the default one.
RBAC: get/list nodes; get/list nodepools; get/list/delete nodeclaims (group karpenter.sh).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from autoheal import labels as lb
from pools import kube
from pools.base import BackendError, NodeResult, PoolHealth
from pools.registry import BackendOptions

GROUP: Final = "karpenter.sh"
VERSION: Final = "v1"
NODEPOOL_LABEL: Final = f"{GROUP}/nodepool"  # on NodeClaims and Nodes: the NodePool that launched them
NO_REBOOT: Final = (
    "Karpenter has no reboot: a NodeClaim is replaced, never rebooted (retire the node instead)"
)


@dataclass(frozen=True)
class Claim:
    """The parts of one NodeClaim the backend acts on."""

    name: str
    uid: str
    nodepool: str
    node: str
    provider_id: str
    deleting: bool
    # Karpenter's Initialized condition: registered (the NodePool's labels and taints are on the
    # Node, its own `karpenter.sh/unregistered` taint is gone) and the Node Ready with its resources
    initialized: bool

    def usable(self, ready_nodes: set[str]) -> bool:
        """Initialized, not deleting, and its Node Ready now."""
        return self.initialized and not self.deleting and self.node in ready_nodes

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Claim:
        meta, status = obj.get("metadata", {}), obj.get("status") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            nodepool=(meta.get("labels") or {}).get(NODEPOOL_LABEL, ""),
            node=status.get("nodeName", ""),
            provider_id=status.get("providerID", ""),
            deleting=bool(meta.get("deletionTimestamp")),
            initialized=any(
                c.get("type") == "Initialized" and c.get("status") == "True"
                for c in status.get("conditions") or []
            ),
        )


def pool_of(nodepool: dict[str, Any]) -> str:
    """The pool a NodePool serves: its template's `autoheal.io/pool` label, else its own name."""
    labels = ((nodepool.get("spec", {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
    return str(labels.get(lb.POOL_LABEL) or nodepool["metadata"]["name"])


class KarpenterBackend:
    name = "karpenter"

    def __init__(self, kubeconfig: str | None = None, core_api: Any = None) -> None:
        self._kubeconfig = kubeconfig
        self._core = core_api

    # --- plumbing -----------------------------------------------------------------------------

    @property
    def core(self) -> Any:
        if self._core is None:
            self._core = kube.core_api(self._kubeconfig)
        return self._core

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.core.api_client)

    def _list(self, plural: str) -> list[dict[str, Any]]:
        from kubernetes.client.exceptions import ApiException

        try:
            items: list[dict[str, Any]] = self.custom.list_cluster_custom_object(GROUP, VERSION, plural)[
                "items"
            ]
        except ApiException as exc:
            if exc.status == 404:
                raise BackendError(
                    f"the cluster serves no {plural}.{GROUP}/{VERSION}: is Karpenter (v1 CRDs) installed?"
                ) from exc
            raise BackendError(
                f"listing {plural}.{GROUP}: HTTP {exc.status} {exc.reason}"
                + (" (RBAC: grant list on it)" if exc.status == 403 else "")
            ) from exc
        return items

    def claims(self) -> list[Claim]:
        return [Claim.of(o) for o in self._list("nodeclaims")]

    # --- reboot -------------------------------------------------------------------------------

    def reboot(self, nodes: Sequence[str], timeout: float) -> list[NodeResult]:
        return [NodeResult(n, ok=False, detail=NO_REBOOT) for n in nodes]

    # --- retire -------------------------------------------------------------------------------

    def _resolve(
        self, views: dict[str, kube.NodeView | None], claims: list[Claim]
    ) -> tuple[dict[str, NodeResult], dict[str, Claim]]:
        """Each node's NodeClaim to delete, or its result when there is nothing to delete."""
        results: dict[str, NodeResult] = {}
        todo: dict[str, Claim] = {}
        for name, view in views.items():
            if view is None:
                # the Node is gone; a NodeClaim naming it may still stand (someone deleted the Node)
                left = [c for c in claims if c.node == name]
                live = [c for c in left if not c.deleting]
                if live:
                    todo[name] = live[0]
                else:
                    state = f"NodeClaim {left[0].name} deleting" if left else "no Node, no NodeClaim"
                    results[name] = NodeResult(name, ok=True, detail=f"already retired ({state})")
                continue
            if not view.provider_id:
                results[name] = NodeResult(name, ok=False, detail="refused: the Node has no spec.providerID")
                continue
            mine = [c for c in claims if c.provider_id == view.provider_id and c.node in ("", name)]
            if not mine:
                results[name] = NodeResult(
                    name,
                    ok=False,
                    detail=f"refused: no NodeClaim has providerID {view.provider_id}",
                )
            elif mine[0].deleting:
                results[name] = NodeResult(
                    name,
                    ok=True,
                    instance=mine[0].name,
                    detail=f"already retired (NodeClaim {mine[0].name} deleting)",
                )
            else:
                todo[name] = mine[0]
        return results, todo

    def _delete(self, node: str, claim: Claim) -> NodeResult:
        from kubernetes.client.exceptions import ApiException

        try:
            # the UID precondition: a NodeClaim recreated under the same name is not this one
            self.custom.delete_cluster_custom_object(
                GROUP, VERSION, "nodeclaims", claim.name, body={"preconditions": {"uid": claim.uid}}
            )
        except ApiException as exc:
            if exc.status == 404:
                return NodeResult(
                    node,
                    ok=True,
                    instance=claim.name,
                    detail=f"already retired (NodeClaim {claim.name} gone)",
                )
            if exc.status == 409:
                return NodeResult(
                    node,
                    ok=False,
                    instance=claim.name,
                    detail=f"refused: NodeClaim {claim.name} was replaced meanwhile (UID changed); retry",
                )
            hint = " (RBAC: grant delete on nodeclaims.karpenter.sh)" if exc.status == 403 else ""
            return NodeResult(
                node,
                ok=False,
                instance=claim.name,
                detail=f"deleting NodeClaim {claim.name}: HTTP {exc.status} {exc.reason}{hint}",
            )
        return NodeResult(
            node,
            ok=True,
            changed=True,
            instance=claim.name,
            detail=f"NodeClaim {claim.name} deleted (NodePool {claim.nodepool or '?'} replaces it)",
        )

    def retire(self, nodes: Sequence[str], dry_run: bool = False) -> list[NodeResult]:
        """Delete each node's NodeClaim (its NodePool replaces it); `dry_run`: read only, a node
        that would be retired is ok, unchanged, with `extra.would_retire`. A changed result's
        `extra.pool` is the node's pool (`autoheal pool retire --wait-replacement` waits on it)."""
        claims = self.claims()
        views = kube.read_nodes(self.core, nodes)
        results, todo = self._resolve(views, claims)
        pools = {n: ((v.pool if v else "") or self._pool_of(todo[n])) for n, v in views.items() if n in todo}
        if dry_run:
            for name, claim in todo.items():
                extra = {"pool": pools[name], "nodepool": claim.nodepool, "would_retire": True}
                detail = f"would delete NodeClaim {claim.name} (NodePool {claim.nodepool})"
                results[name] = NodeResult(name, ok=True, instance=claim.name, detail=detail, extra=extra)
            return [results[n] for n in nodes]
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(todo)))) as ex:
            for r in ex.map(lambda item: self._delete(*item), todo.items()):
                extra = {"pool": pools[r.node], "nodepool": todo[r.node].nodepool}
                results[r.node] = NodeResult(r.node, r.ok, r.changed, r.detail, r.instance, extra)
        return [results[n] for n in nodes]

    def _pool_of(self, claim: Claim) -> str:
        """A NodeClaim's pool when its Node is gone: its NodePool's pool label, else the NodePool."""
        for np in self._list("nodepools"):
            if np["metadata"]["name"] == claim.nodepool:
                return pool_of(np)
        return claim.nodepool

    # --- health -------------------------------------------------------------------------------

    def health(self, pools: Sequence[str]) -> list[PoolHealth]:
        nodepools = self._list("nodepools")
        claims = self.claims()
        ready = {v.name for v in kube.list_nodes(self.core) if v.ready}
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for np in nodepools:
            by_pool.setdefault(pool_of(np), []).append(np)
        out = []
        for pool in list(pools) or sorted(by_pool):
            nps = by_pool.get(pool, [])
            if not nps:
                out.append(PoolHealth(pool, self.name, ok=False, detail=f"no NodePool for pool {pool}"))
                continue
            names = {np["metadata"]["name"] for np in nps}
            mine = [c for c in claims if c.nodepool in names]
            live = [c for c in mine if not c.deleting]
            up = sorted(c.node for c in live if c.usable(ready))
            static = [np for np in nps if np.get("spec", {}).get("replicas") is not None]
            desired = sum(int(np["spec"]["replicas"]) for np in static)
            counts = {
                "nodepools": len(nps),
                "desired": desired,
                "nodeclaims": len(live),
                "ready_nodes": len(up),
                "launching": len(live) - len(up),
                "deleting": len(mine) - len(live),
            }
            kind = "static" if len(static) == len(nps) else "dynamic"
            ok = len(up) >= desired if static else True
            detail = (
                f"NodePools {', '.join(sorted(names))} ({kind}): {len(up)}/{desired if static else len(live)}"
                f" NodeClaims initialized with a Ready Node, {counts['launching']} launching,"
                f" {counts['deleting']} deleting"
            )
            out.append(PoolHealth(pool, self.name, ok, detail, counts, up))
        return out


def from_options(opts: BackendOptions) -> KarpenterBackend:
    """The registry's factory (pools/registry.py): `--kubeconfig`."""
    return KarpenterBackend(opts.kubeconfig or None)
