"""`autoheal pool ...`: reboot, retire and read a GPU pool's nodes through its backend.

The runbook's node_pool role calls these (roles/node_pool/tasks/backends/<backend>/*.yml). With
--json the output is a list of pools.base.NodeResult (reboot, retire) or PoolHealth (status)
dicts; the exit status is 0 when the call worked (a node that failed is `ok: false` in the
list) and 2 with a one-line error when the backend could not act on the batch at all.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from autoheal.backends import POOL_CLUSTER_ENV
from autoheal.errors import ValidationError
from autoheal.names import validate_node_name
from pools.base import BackendError, NodeResult, PoolBackend, PoolHealth
from pools.registry import BackendOptions, backend, names

pool_app = typer.Typer(
    help="Reboot, retire and read a GPU pool's nodes through its backend (aws, lab...).",
    no_args_is_help=True,
)
out = Console()

BackendOpt = Annotated[str, typer.Option("--backend", help="The pool backend (`autoheal pool backends`).")]
KubeconfigOpt = Annotated[
    str, typer.Option("--kubeconfig", help="Kubeconfig; default in-cluster, else ~/.kube/config.")
]
ClusterOpt = Annotated[
    str,
    typer.Option(
        "--cluster",
        envvar=POOL_CLUSTER_ENV,
        help="The cloud cluster the backend may act on (aws: the EKS cluster, tag eks:cluster-name).",
    ),
]
OptionOpt = Annotated[
    list[str] | None, typer.Option("--option", help="A backend-specific KEY=VALUE (repeatable).")
]
NodesOpt = Annotated[str, typer.Option("--nodes", help="Comma-separated Kubernetes node names.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def parse_nodes(value: str) -> list[str]:
    """The --nodes list, each a valid node name, in order, without duplicates."""
    nodes = [n.strip() for n in value.split(",") if n.strip()]
    if not nodes:
        raise ValidationError("--nodes: no node named; give comma-separated Kubernetes node names")
    return list(dict.fromkeys(validate_node_name(n, "--nodes") for n in nodes))


def parse_options(values: Sequence[str] | None) -> dict[str, str]:
    opts: dict[str, str] = {}
    for item in values or ():
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValidationError(f"--option {item!r}: expected KEY=VALUE")
        opts[key] = val
    return opts


def _backend(name: str, kubeconfig: str, cluster: str, option: Sequence[str] | None) -> PoolBackend:
    return backend(
        name, BackendOptions(kubeconfig=kubeconfig, cluster=cluster, options=parse_options(option))
    )


def wait_replacements(
    pools: PoolBackend,
    results: list[NodeResult],
    before: Sequence[PoolHealth],
    timeout: float,
    poll: float = 1.0,
) -> list[NodeResult]:
    """For each pool a retire changed (`extra.pool`): wait, at most `timeout` seconds, until its
    health is ok (back at its declared size) without the retired nodes. Those nodes' results
    then carry `extra.replacements` (the pool's new members); a pool not back in time turns them
    ok=False with what the backend sees."""
    retired = [r for r in results if r.ok and r.changed]
    if not retired:
        return results
    gone = {r.node for r in retired}
    wanted = sorted({str(r.extra.get("pool", "")) for r in retired} - {""})
    start = time.monotonic()
    while True:
        now = {h.pool: h for h in pools.health(wanted)}
        back = {p for p, h in now.items() if h.ok and not gone & set(h.members)}
        if len(back) == len(now) or time.monotonic() - start >= timeout:
            break
        time.sleep(poll)
    secs = round(time.monotonic() - start, 1)
    earlier = {h.pool: set(h.members) for h in before}
    updated: list[NodeResult] = []
    for r in results:
        pool = str(r.extra.get("pool", ""))
        if r.node not in gone or pool not in now:
            updated.append(r)
            continue
        h = now[pool]
        extra = {**r.extra, "replacements": sorted(set(h.members) - earlier.get(pool, set())), "waited": secs}
        if pool in back:
            updated.append(
                NodeResult(r.node, True, True, f"{r.detail}; pool {pool} back in {secs}s", r.instance, extra)
            )
        else:
            why = f"retired, but no replacement within {timeout:g}s: {h.detail}"
            updated.append(NodeResult(r.node, False, True, why, r.instance, extra))
    return updated


def _print(rows: Sequence[NodeResult | PoolHealth], as_json: bool) -> None:
    if as_json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
        return
    t = Table(show_edge=False)
    if rows and isinstance(rows[0], PoolHealth):
        for col in ("pool", "backend", "ok", "counts", "members", "detail"):
            t.add_column(col)
        for h in rows:
            assert isinstance(h, PoolHealth)
            counts = " ".join(f"{k}={v}" for k, v in h.counts.items())
            t.add_row(h.pool, h.backend, str(h.ok), counts, ",".join(h.members), h.detail)
    else:
        for col in ("node", "instance", "ok", "changed", "detail"):
            t.add_column(col)
        for r in rows:
            assert isinstance(r, NodeResult)
            t.add_row(r.node, r.instance, str(r.ok), str(r.changed), r.detail)
    out.print(t)


@pool_app.command("reboot")
def reboot_cmd(
    backend_name: BackendOpt,
    nodes: NodesOpt,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds each node may take to come back.")
    ] = 600,
    kubeconfig: KubeconfigOpt = "",
    cluster: ClusterOpt = "",
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Reboot the nodes' machines (one batch); ok once each is Ready after a new boot."""
    names_ = parse_nodes(nodes)
    _print(_backend(backend_name, kubeconfig, cluster, option).reboot(names_, timeout), as_json)


@pool_app.command("retire")
def retire_cmd(
    backend_name: BackendOpt,
    nodes: NodesOpt,
    wait_replacement: Annotated[
        bool, typer.Option("--wait-replacement", help="Wait until each pool is back at its size.")
    ] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for the replacements.")] = 300,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Read only: say which nodes would be retired (check mode).")
    ] = False,
    kubeconfig: KubeconfigOpt = "",
    cluster: ClusterOpt = "",
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Retire the nodes' machines; the pool's own machinery replaces them (its size kept)."""
    names_ = parse_nodes(nodes)
    b = _backend(backend_name, kubeconfig, cluster, option)
    if dry_run:
        if "dry_run" not in inspect.signature(b.retire).parameters:
            raise BackendError(f"backend {backend_name} has no dry run: run without --dry-run/check mode")
        _print(b.retire(names_, dry_run=True), as_json)  # type: ignore[call-arg]
        return
    before = b.health([]) if wait_replacement else []
    results = b.retire(names_)
    if wait_replacement:
        results = wait_replacements(b, results, before, timeout)
    _print(results, as_json)


@pool_app.command("status")
def status_cmd(
    backend_name: BackendOpt,
    pool: Annotated[
        list[str] | None, typer.Option("--pool", help="A pool (repeatable); default all.")
    ] = None,
    kubeconfig: KubeconfigOpt = "",
    cluster: ClusterOpt = "",
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What the backend sees of the pools: counts, members, whether each is at its size."""
    _print(_backend(backend_name, kubeconfig, cluster, option).health(pool or []), as_json)


@pool_app.command("backends")
def backends_cmd() -> None:
    """The backends this installation knows."""
    for name in names():
        print(name)


def register(app: Any) -> None:
    """Add `autoheal pool ...` to the root app (entry point `autoheal.cli`)."""
    app.add_typer(pool_app, name="pool")
