"""`autoheal lab ...`: the local lab's commands, registered into the root CLI by entry point.

The lab sits above the runner and the components (it starts both), so the core CLI never imports
it; `autoheal.cli` finds this module through the `autoheal.cli` entry-point group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from autoheal.cli import JsonOpt
from autoheal.errors import AutohealError, ConfigError

# Every `autoheal` command loads every plugin's commands: the lab's modules are imported by the lab
# commands that run, not by `autoheal pause`.
if TYPE_CHECKING:
    from lab import lab as labmod
    from lab.config import LabConfig
    from lab.poolapi import PoolApi

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
    from pydantic import ValidationError

    from lab.config import LabConfig

    try:
        return LabConfig(**kw)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from exc


SlurmOpt = Annotated[
    Literal["host", "pods"],
    typer.Option(
        help="Where Slurm and the runner run: host processes, or the pods `pulumi up` declares on"
        " real nodes (every node real)."
    ),
]

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
    slurm: SlurmOpt = "host",
    backend: Annotated[
        Literal["lab", "aws"],
        typer.Option(
            help="Who plays the pool's cloud: the lab's pool controller, or EC2 + Auto Scaling (moto)"
            " whose instances become lab nodes."
        ),
    ] = "lab",
) -> None:
    """Start the lab (idempotent: a running lab is left as it is)."""
    from lab import lab as labmod
    from lab.config import PoolConfig

    kw: dict[str, object] = {}
    if root is not None:
        kw["root"] = root
    cfg = _lab_config(
        name=name,
        port_base=port_base,
        pools=[PoolConfig(size=nodes, spares=spares, headroom=headroom, gpus_per_node=gpus, backend=backend)],
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
        slurm=slurm,
        **kw,
    )
    cfg = labmod.up(cfg, _progress)
    _print_status(labmod.status(cfg), False)


@lab_app.command("status")
def lab_status(name: NameOpt = "default", root: RootOpt = None, json_: JsonOpt = False) -> None:
    """Show every lab service and whether it is healthy (exit 1 if not)."""
    from lab import lab as labmod

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


# The proof's own control plane: a block of its own, clear of a lab's (21000..) and the tests'.
PROOF_PORT_BASE = 26700


@lab_app.command("schedulable")
def lab_schedulable(
    stack: Annotated[str, typer.Option("--stack", help="The stack to prove (Pulumi.<stack>.yaml).")],
    project: Annotated[
        Path, typer.Option("--project", help="The Pulumi project folder holding the stack file.")
    ] = Path("."),
    port_base: Annotated[
        int, typer.Option("--port-base", help="First of 6 loopback ports for the proof's control plane.")
    ] = PROOF_PORT_BASE,
    timeout: Annotated[float, typer.Option(help="Seconds the scheduler gets to settle.")] = 120.0,
    json_: JsonOpt = False,
) -> None:
    """Prove the stack can schedule: what it declares (run under Pulumi mocks, the cloud simulated),
    applied to a fresh control plane whose KWOK nodes are shaped like the nodes it asks for, the real
    kube-scheduler deciding. Names each pod that cannot run and why (exit 1)."""
    import tempfile

    from lab import schedulable

    project = project.resolve()
    if not (project / f"Pulumi.{stack}.yaml").is_file():
        raise ConfigError(f"--stack {stack}: no Pulumi.{stack}.yaml in {project} (set --project)")
    with tempfile.TemporaryDirectory(prefix="autoheal-proof-") as tmp:
        _progress(f"recording what stack {stack} declares (Pulumi mocks)")
        rows = schedulable.record_stack(project, stack, Path(tmp) / "declared.json")
        _progress(f"proving it on a control plane at 127.0.0.1:{port_base + 2}")
        report = schedulable.prove(rows, Path(tmp) / "cluster", port_base, timeout=timeout)
    if json_:
        out.print_json(json.dumps({"stack": stack, **report.as_dict()}))
    else:
        typer.echo(report.text())  # plain lines: rich would wrap them at 80 columns in a pipe
    raise typer.Exit(0 if report.ok else 1)


@lab_app.command("down")
def lab_down(name: NameOpt = "default", root: RootOpt = None) -> None:
    """Stop every process the lab caused: its Slurm jobs (and their job steps), then its services
    by PID (a no-op when nothing runs)."""
    from lab import lab as labmod
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
    from lab import lab as labmod

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
    from lab import lab as labmod

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
    slurm: Annotated[
        Literal["host", "pods"],
        typer.Option(
            help="pods: Slurm and the runner as the stack's pods on 3 real nodes (2 training, a hot"
            " spare); host: host processes on a 6-node pool (2 of its nodes real)."
        ),
    ] = "pods",
    real_nodes: Annotated[
        int,
        typer.Option(help="--slurm host: how many of the pool's nodes are real (containerd + kubelet)."),
    ] = 2,
    json_: JsonOpt = False,
    scenario: Annotated[
        Literal["xid", "burst"],
        typer.Option(
            help="xid: a GPU dies under training; burst: an inference burst borrows an idle Slurm node"
            " and gives it back (lab/burst.py: a pods lab of 2 real nodes, its own timers)."
        ),
    ] = "xid",
    fault: Annotated[
        Literal["xid", "link-flap"],
        typer.Option(
            help="link-flap: a flapping link drains a node, the job runs on (lab/degraded_demo.py)."
        ),
    ] = "xid",
) -> None:
    """A GPU dies during training and the job resumes by itself: the whole story, measured."""
    from lab.config import PoolConfig
    from lab.demo import run_demo

    if fault == "link-flap":
        from lab import degraded_demo

        cfg = degraded_demo.lab_config(name, port_base, root)
        report = degraded_demo.run(cfg, keep, console, out, report_dir, timeout)
        if json_:
            print(json.dumps(report))
        return

    if scenario == "burst":
        from lab import burst

        cfg = burst.lab_config(name, port_base, root)
        report = burst.run_demo(cfg, keep, console, out, report_dir, timeout)
        if json_:
            print(json.dumps(report))
        return

    kw: dict[str, object] = {"root": root} if root else {}
    if slurm == "pods":
        kw["pools"] = [PoolConfig(size=2, spares=1, headroom=3)]
    else:
        kw["real_nodes"] = real_nodes
    cfg = _lab_config(
        name=name,
        port_base=port_base,
        grace_seconds=grace,
        provision_delay=provision_delay,
        slurm=slurm,
        **kw,
    )
    report = run_demo(cfg, keep, console, out, report_dir, timeout)
    if json_:
        print(json.dumps(report))


pool_app = typer.Typer(help="The lab's node-pool controller (plays the cloud).", no_args_is_help=True)
lab_app.add_typer(pool_app, name="pool")


UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url", help="The pool API's URL, for a caller without the lab's files (the runner's pod)."
    ),
]
TokenFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file", help="With --url: a file holding the bearer token (a ServiceAccount token)."
    ),
]


def _api(name: str, root: Path | None, url: str | None, token_file: Path | None) -> PoolApi:
    """The pool API of the named lab (loopback, from its lab.json), or the one at --url."""
    from lab import lab as labmod
    from lab.poolapi import PoolApi

    if url is not None:
        return PoolApi.remote(url, token_file)
    return PoolApi.of_lab(labmod.require(name, root))


@pool_app.command("status")
def pool_status(
    name: NameOpt = "default",
    root: RootOpt = None,
    json_: JsonOpt = False,
    url: UrlOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Declared vs actual members of each pool, pending replacements, retired nodes."""
    st = _api(name, root, url, token_file).status()
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
    url: UrlOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Terminate nodes the way a cloud autoscaling group would (a batch concurrently); the pool
    backfills them. --json prints one result per node."""
    from concurrent.futures import ThreadPoolExecutor

    from autoheal.names import validate_node_name

    api = _api(name, root, url, token_file)
    nodes = [validate_node_name(n, "--node") for n in node]
    with ThreadPoolExecutor(min(16, len(nodes))) as ex:
        results = list(ex.map(api.retire, nodes))
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


def _ladder_call(api: PoolApi, node: str | None, what: str, nodes: str | None = None, **kw: object) -> None:
    """Run one of the pool API's ladder operations (lab.ladder.batch, in the pool controller).

    With `node`: print its JSON result, exit 1 naming the failure. With `nodes` (comma-separated):
    all of them at once, one JSON list of per-node results shaped like an Ansible loop of single
    calls ({item, rc, stdout, stderr}), exit 0: a storm's batch costs one process and one call,
    and its reboots overlap as a cloud's would (filter autoheal.cluster.batch_results reads it)."""
    from autoheal.names import validate_node_name

    if (node is None) == (nodes is None):
        console.print("[red]give --node NAME or --nodes A,B,...[/red]")
        raise typer.Exit(2)
    if node is not None:
        node = validate_node_name(node, "--node")
        [res] = api.ladder(what, [node], **kw)
        if res["rc"] != 0:
            console.print(f"[red]{res['stderr']}[/red]")
            raise typer.Exit(1)
        out.print_json(res["stdout"])
        return
    batch = [validate_node_name(n, "--nodes") for n in (nodes or "").split(",") if n]
    typer.echo(json.dumps(api.ladder(what, batch, **kw)))  # one line for a machine


@pool_app.command("health")
def pool_health(
    node: Annotated[str | None, typer.Option(help="The node to check.")] = None,
    nodes: NodesOpt = None,
    peek: Annotated[bool, typer.Option(help="Only read the GPUs (evidence): run no check.")] = False,
    name: NameOpt = "default",
    root: RootOpt = None,
    url: UrlOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """The lab's DCGM diagnostics for a node (JSON: healthy, failures, GPUs, evidence sources)."""
    _ladder_call(_api(name, root, url, token_file), node, "health", nodes, peek=peek)


@pool_app.command("reset")
def pool_reset(
    node: Annotated[str | None, typer.Option(help="The node whose GPU to reset.")] = None,
    nodes: NodesOpt = None,
    gpu: GpuOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds before a reset counts as hung.")] = 60,
    name: NameOpt = "default",
    root: RootOpt = None,
    url: UrlOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Reset a GPU of a node (nvidia-smi --gpu-reset on a real node); exit 1 when it fails."""
    _ladder_call(_api(name, root, url, token_file), node, "reset", nodes, gpu=gpu, timeout=timeout)


@pool_app.command("reboot")
def pool_reboot(
    node: Annotated[str | None, typer.Option(help="The node to reboot.")] = None,
    nodes: NodesOpt = None,
    timeout: Annotated[float, typer.Option(help="Seconds before a reboot counts as hung.")] = 120,
    name: NameOpt = "default",
    root: RootOpt = None,
    url: UrlOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Reboot a node the way the cloud's reboot API would; exit 1 when it fails or hangs."""
    _ladder_call(_api(name, root, url, token_file), node, "reboot", nodes, timeout=timeout)


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
    from lab import lab as labmod
    from lab.poolapi import PoolApi

    _ladder_call(
        PoolApi.of_lab(labmod.require(name, root)),
        node,
        "faults",
        health_failures=health_failures,
        reset=reset,
        reboot=reboot,
    )


def register(app: typer.Typer) -> None:
    """Add `autoheal lab ...` to the root app."""
    app.add_typer(lab_app, name="lab")
