"""`autoheal lab ...`: the local lab's commands, registered into the root CLI by entry point.

The lab sits above the runner and the components (it starts both), so the core CLI never imports
it; `autoheal.cli` finds this module through the `autoheal.cli` entry-point group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from autoheal.cli import JsonOpt
from autoheal.errors import AutohealError, ConfigError
from lab import lab as labmod
from lab.config import LabConfig, PoolConfig

console = Console(stderr=True)
out = Console()

NameOpt = Annotated[str, typer.Option("--name", help="Lab name (its run dir is <root>/<name>).")]
RootOpt = Annotated[
    Path | None,
    typer.Option("--root", help="Directory holding labs [env AUTOHEAL_LAB_ROOT, .lab]."),
]


def _progress(msg: str) -> None:
    console.print(f"[dim]lab[/dim] {msg}")


def _lab_config(**kw: object) -> LabConfig:
    """LabConfig from the options; a combination it refuses is one line naming the field and fix."""
    try:
        return LabConfig(**kw)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from exc


lab_app = typer.Typer(
    help="The local lab: real Slurm, Prometheus, Alertmanager, Kubernetes.", no_args_is_help=True
)


@lab_app.command("up")
def lab_up(
    name: NameOpt = "default",
    root: RootOpt = None,
    port_base: Annotated[int, typer.Option(help="First of the lab's loopback ports.")] = 21000,
    nodes: Annotated[int, typer.Option(help="Active GPU nodes in the pool.")] = 4,
    spares: Annotated[int, typer.Option(help="Hot spare nodes.")] = 2,
    headroom: Annotated[int, typer.Option(help="FUTURE nodes replacements can use.")] = 6,
    gpus: Annotated[int, typer.Option(help="GPUs per node.")] = 8,
    webhook_url: Annotated[
        str | None, typer.Option(help="Where Alertmanager posts (default: the lab's runner).")
    ] = None,
    kube: Annotated[bool, typer.Option(help="Start the Kubernetes control plane if built.")] = True,
    runner: Annotated[bool, typer.Option(help="Start the remediation runner.")] = True,
    grace: Annotated[int, typer.Option(help="Job grace period in seconds (Slurm KillWait).")] = 120,
    provision_delay: Annotated[
        float, typer.Option(help="Seconds the pool controller takes to bring a replacement.")
    ] = 5.0,
    real_nodes: Annotated[
        int,
        typer.Option(help="How many nodes are real (containerd + kubelet + kube-proxy) instead of KWOK."),
    ] = 0,
    interval: Annotated[
        str, typer.Option(help="Prometheus scrape and evaluation interval (production: 15s to 30s).")
    ] = "1s",
    watchers: Annotated[bool, typer.Option(help="One XID watcher per node (labs of up to 64 nodes).")] = True,
    runner_journal: Annotated[
        Literal["sqlite", "postgres"],
        typer.Option(help="The runner's journal: a SQLite file, or a PostgreSQL server the lab runs."),
    ] = "sqlite",
    runner_replicas: Annotated[
        int,
        typer.Option(
            min=1,
            max=3,
            help="Runner replicas; more than 1 elect a leader on a Lease (needs --runner-journal postgres).",
        ),
    ] = 1,
) -> None:
    """Start the lab (idempotent: a running lab is left as it is)."""
    kw: dict[str, object] = {}
    if root is not None:
        kw["root"] = root
    cfg = _lab_config(
        name=name,
        port_base=port_base,
        pools=[PoolConfig(size=nodes, spares=spares, headroom=headroom, gpus_per_node=gpus)],
        webhook_url=webhook_url,
        kube=kube,
        runner=runner,
        grace_seconds=grace,
        provision_delay=provision_delay,
        real_nodes=real_nodes,
        interval=interval,
        watchers=watchers,
        runner_journal=runner_journal,
        runner_replicas=runner_replicas,
        **kw,
    )
    cfg = labmod.up(cfg, _progress)
    _print_status(labmod.status(cfg), False)


@lab_app.command("status")
def lab_status(name: NameOpt = "default", root: RootOpt = None, json_: JsonOpt = False) -> None:
    """Show every lab service and whether it is healthy (exit 1 if not)."""
    st = labmod.status(labmod.require(name, root))
    _print_status(st, json_)
    raise typer.Exit(0 if st.healthy else 1)


def _print_status(st: labmod.LabStatus, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(st.as_dict()))
        return
    t = Table(title=f"lab {st.name}: {'healthy' if st.healthy else 'NOT healthy'}")
    t.add_column("service")
    t.add_column("state")
    t.add_column("detail")
    for s in st.services:
        t.add_row(s.name, "[green]ok[/green]" if s.healthy else "[red]down[/red]", s.detail)
    out.print(t)


@lab_app.command("down")
def lab_down(name: NameOpt = "default", root: RootOpt = None) -> None:
    """Stop every process the lab caused: its Slurm jobs (and their job steps), then its services
    by PID (a no-op when nothing runs)."""
    from lab.config import load_lab

    cfg = load_lab(name, root)
    if cfg is None:
        console.print(f"lab {name!r}: nothing to stop")
        return
    console.print(f"lab {name!r}: {labmod.down(cfg).summary()}")


@lab_app.command("logs")
def lab_logs(
    name: NameOpt = "default",
    root: RootOpt = None,
    service: Annotated[str | None, typer.Argument(help="Service whose log tail to print.")] = None,
    lines: int = 40,
) -> None:
    """List the lab's log files, or print the tail of one."""
    files = labmod.logs(labmod.require(name, root))
    if service is None:
        for svc, path in files.items():
            out.print(f"{svc:30} {path}")
        return
    if service not in files:
        raise AutohealError(f"no log for {service!r}; known: {', '.join(files)}")
    text = files[service].read_text(errors="replace").splitlines()
    out.print("\n".join(text[-lines:]), markup=False, highlight=False)


@lab_app.command("inject")
def lab_inject(
    node: Annotated[str, typer.Option(help="Node name, e.g. gpu-2.")],
    name: NameOpt = "default",
    root: RootOpt = None,
    gpu: Annotated[int | None, typer.Option(help="GPU index on the node.")] = None,
    xid: Annotated[int | None, typer.Option(help="XID to raise, e.g. 79.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Clear the node's (or GPU's) XID.")] = False,
    vanish: Annotated[
        bool, typer.Option("--vanish", help="The GPU's metrics vanish (as when DCGM loses it) instead.")
    ] = False,
) -> None:
    """Raise an XID on a simulated GPU (or clear it with --clear); the node's kernel log gets the
    driver's line either way."""
    if clear == (xid is not None):
        raise AutohealError("give exactly one of --xid N or --clear")
    labmod.inject(labmod.require(name, root), node, gpu, None if clear else xid, vanish=vanish)
    console.print(f"{'cleared' if clear else f'XID {xid} raised on'} {node} gpu {gpu}")


@lab_app.command("demo")
def lab_demo(
    name: NameOpt = "demo",
    root: RootOpt = None,
    port_base: Annotated[int, typer.Option(help="First of the lab's loopback ports.")] = 21000,
    keep: Annotated[bool, typer.Option(help="Leave the lab up afterwards to explore.")] = False,
    grace: Annotated[int, typer.Option(help="Grace period for jobs to checkpoint (s).")] = 120,
    provision_delay: Annotated[float, typer.Option(help="Cloud provisioning delay (s).")] = 5.0,
    report_dir: Annotated[Path | None, typer.Option(help="Where report.json and timeline.png go.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 600,
    real_nodes: Annotated[
        int,
        typer.Option(help="How many of the pool's nodes are real (containerd + kubelet) instead of KWOK."),
    ] = 2,
    json_: JsonOpt = False,
) -> None:
    """A GPU dies during training and the job resumes by itself: the whole story, measured."""
    from lab.demo import run_demo

    kw: dict[str, object] = {"root": root} if root else {}
    cfg = LabConfig(
        name=name,
        port_base=port_base,
        grace_seconds=grace,
        provision_delay=provision_delay,
        real_nodes=real_nodes,
        **kw,  # type: ignore[arg-type]
    )
    report = run_demo(cfg, keep, console, out, report_dir, timeout)
    if json_:
        print(json.dumps(report))


pool_app = typer.Typer(help="The lab's node-pool controller (plays the cloud).", no_args_is_help=True)
lab_app.add_typer(pool_app, name="pool")


@pool_app.command("status")
def pool_status(name: NameOpt = "default", root: RootOpt = None, json_: JsonOpt = False) -> None:
    """Declared vs actual members of each pool, pending replacements, retired nodes."""
    from lab import pool

    st = pool.client_status(labmod.require(name, root))
    if json_:
        out.print_json(json.dumps(st))
        return
    t = Table(title="node pools")
    for col in ("pool", "declared", "members", "pending", "headroom left"):
        t.add_column(col)
    for pname, p in st["pools"].items():
        t.add_row(
            pname, str(p["declared"]), " ".join(p["members"]), " ".join(p["pending"]), str(p["headroom_left"])
        )
    out.print(t)
    if st["retired"]:
        out.print(f"retired: {' '.join(st['retired'])}")


@pool_app.command("retire")
def pool_retire(
    node: Annotated[list[str], typer.Option(help="A node to terminate (repeat for a batch).")],
    name: NameOpt = "default",
    root: RootOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Terminate nodes the way a cloud autoscaling group would (a batch concurrently); the pool
    backfills them. --json prints one result per node."""
    from concurrent.futures import ThreadPoolExecutor

    from autoheal.names import validate_node_name
    from lab import pool

    cfg = labmod.require(name, root)
    nodes = [validate_node_name(n, "--node") for n in node]
    with ThreadPoolExecutor(min(16, len(nodes))) as ex:
        results = list(ex.map(lambda n: pool.client_retire(cfg, n), nodes))
    if json_:
        out.print_json(json.dumps(results))
        return
    for n, res in zip(nodes, results, strict=True):
        console.print(f"{n}: {'retired' if res['changed'] else 'already retired'}")


GpuOpt = Annotated[int | None, typer.Option(help="GPU index; default: every GPU of the node.")]
NodesOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated nodes, all at once (JSON list of per-node results, exit 0)."),
]


def _item(node: str, res: object, what: str) -> dict[str, object]:
    """One node's result of a batch, shaped as one item of an Ansible loop of single calls."""
    if isinstance(res, Exception):
        return {"item": node, "rc": 1, "stdout": "", "stderr": f"{what} {node}: {res}"}
    return {"item": node, "rc": 0, "stdout": json.dumps(res), "stderr": ""}


def _ladder_call(
    name: str, root: Path | None, node: str | None, what: str, nodes: str | None = None, **kw: object
) -> None:
    """Run one of lab.ladder's operations and print its JSON; exit 1 naming the failure.

    With `nodes` (comma-separated) it runs for all of them at once, in threads, and prints one JSON
    list shaped like the results of an Ansible loop of single calls ({item, rc, stdout, stderr}
    per node), exit 0: a storm's batch costs one process, not one per node, and its reboots
    overlap as a cloud's would (filter autoheal.cluster.batch_results reads it)."""
    from concurrent.futures import ThreadPoolExecutor

    from autoheal.names import validate_node_name
    from lab import ladder

    if (node is None) == (nodes is None):
        console.print("[red]give --node NAME or --nodes A,B,...[/red]")
        raise typer.Exit(2)
    cfg = labmod.require(name, root)
    if node is not None:
        node = validate_node_name(node, "--node")
        try:
            res = getattr(ladder, what)(cfg, node, **kw)
        except AutohealError as exc:
            console.print(f"[red]{what} {node}:[/red] {exc}")
            raise typer.Exit(1) from exc
        out.print_json(json.dumps(res))
        return
    batch = [validate_node_name(n, "--nodes") for n in (nodes or "").split(",") if n]
    if what == "reboot":  # the batch's slurmds stop, start and register together
        done = ladder.reboot_many(cfg, batch, **kw)  # type: ignore[arg-type]
        typer.echo(json.dumps([_item(n, done[n], what) for n in batch]))
        return

    def one(n: str) -> dict[str, object]:
        try:
            return _item(n, getattr(ladder, what)(cfg, n, **kw), what)
        except Exception as exc:  # one node failing (even a bug) must not hide the others
            return _item(n, exc, what)

    with ThreadPoolExecutor(max(1, min(ladder.BATCH_WORKERS, len(batch)))) as pool:
        results = list(pool.map(one, batch))
    typer.echo(json.dumps(results))  # one line for a machine: no pretty-printing of 100 nodes


@pool_app.command("health")
def pool_health(
    node: Annotated[str | None, typer.Option(help="The node to check.")] = None,
    nodes: NodesOpt = None,
    peek: Annotated[bool, typer.Option(help="Only read the GPUs (evidence): run no check.")] = False,
    name: NameOpt = "default",
    root: RootOpt = None,
) -> None:
    """The lab's DCGM diagnostics for a node (JSON: healthy, failures, GPUs, evidence sources)."""
    _ladder_call(name, root, node, "health", nodes, peek=peek)


@pool_app.command("reset")
def pool_reset(
    node: Annotated[str | None, typer.Option(help="The node whose GPU to reset.")] = None,
    nodes: NodesOpt = None,
    gpu: GpuOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds before a reset counts as hung.")] = 60,
    name: NameOpt = "default",
    root: RootOpt = None,
) -> None:
    """Reset a GPU of a node (nvidia-smi --gpu-reset on a real node); exit 1 when it fails."""
    _ladder_call(name, root, node, "reset", nodes, gpu=gpu, timeout=timeout)


@pool_app.command("reboot")
def pool_reboot(
    node: Annotated[str | None, typer.Option(help="The node to reboot.")] = None,
    nodes: NodesOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds before a reboot counts as hung.")] = 120,
    name: NameOpt = "default",
    root: RootOpt = None,
) -> None:
    """Reboot a node the way the cloud's reboot API would; exit 1 when it fails or hangs."""
    _ladder_call(name, root, node, "reboot", nodes, timeout=timeout)


@pool_app.command("faults")
def pool_faults(
    node: Annotated[str, typer.Option(help="The node to inject into.")],
    health_failures: Annotated[int | None, typer.Option(help="The next N health checks fail.")] = None,
    reset: Annotated[str | None, typer.Option(help="Next resets: ok, fail or hang.")] = None,
    reboot: Annotated[str | None, typer.Option(help="Next reboots: ok, fail or hang.")] = None,
    name: NameOpt = "default",
    root: RootOpt = None,
) -> None:
    """Inject faults of the recovery ladder itself (tests and drills)."""
    _ladder_call(name, root, node, "faults", health_failures=health_failures, reset=reset, reboot=reboot)


def register(app: typer.Typer) -> None:
    """Add `autoheal lab ...` to the root app."""
    app.add_typer(lab_app, name="lab")
