"""The on-call command line: `autoheal serve | incidents | incident show | pause | resume |
breaker | cancel | run | dashboard`. Every listing has `--json` for scripts; tables never render alert text as
markup. `register(app)` adds the commands to the root `autoheal` typer app.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autoheal.errors import AutohealError
from remediation.states import STATES, IncidentState

# Every `autoheal` command loads every plugin's commands: the runner's config and journal (pydantic
# models, the PostgreSQL driver) are imported by the commands that use them, not by `autoheal lab`.
if TYPE_CHECKING:
    from remediation.config import RunnerConfig
    from remediation.journal import IncidentRecord, Journal

ConfigOpt = Annotated[
    Path,
    typer.Option(
        "--config",
        "-c",
        envvar="AUTOHEAL_CONFIG",
        help="Runner config YAML (env AUTOHEAL_CONFIG).",
        show_default=True,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
DEFAULT_CONFIG = Path("config/runner.yaml")


def _fail(msg: str) -> typer.Exit:
    Console(stderr=True).print(Text("error: " + msg, style="red"))
    return typer.Exit(2)


def _config(path: Path) -> RunnerConfig:
    from remediation.config import load_config

    try:
        return load_config(path)
    except AutohealError as exc:
        raise _fail(str(exc)) from exc


def _journal(path: Path) -> Journal:
    from remediation.journal import Journal

    cfg = _config(path)
    try:
        return Journal.configured(cfg.journal_path, cfg.journal_dsn)
    except AutohealError as exc:
        raise _fail(str(exc)) from exc


def _ts(value: float | None) -> str:
    return "" if value is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def serve(config: ConfigOpt = DEFAULT_CONFIG) -> None:
    """Run the webhook server and the remediation worker (until SIGTERM)."""
    import logging

    import uvicorn

    from remediation.app import create_app
    from remediation.runtime import build

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _config(config)
    try:
        rt = build(cfg)
    except AutohealError as exc:
        raise _fail(str(exc)) from exc
    uvicorn.run(
        create_app(rt), host=cfg.listen_host, port=cfg.listen_port, log_level="warning", access_log=False
    )


def incidents(
    config: ConfigOpt = DEFAULT_CONFIG,
    state: Annotated[
        list[str] | None,
        typer.Option("--state", "-s", help=f"Only these states ({', '.join(STATES)}); repeatable."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest.")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """List incidents (newest last)."""
    bad = [s for s in state or [] if s not in STATES]
    if bad:
        raise _fail(f"unknown state(s) {bad}; choose from {list(STATES)}")
    from remediation.cost import incident_cost
    from remediation.policy import BACKEND_VAR

    journal = _journal(config)
    rows = journal.incidents(state or None, limit=limit)
    default_backend = str(_config(config).play_vars.get(BACKEND_VAR) or "")
    if as_json:
        _print_json(
            [
                {
                    **r.as_dict(),
                    "backend": _backend(r, default_backend),
                    "cost": incident_cost(journal.timeline(r.id)),
                }
                for r in rows
            ]
        )
        return
    table = Table(title="autoheal incidents")
    for col in ("id", "node", "xid", "gpu", "tier", "state", "backend", "opened (UTC)", "alerts", "reason"):
        # on a narrow terminal the reason wraps; the names an on-call engineer copies do not
        table.add_column(col, no_wrap=col in ("id", "node", "state"))
    for r in rows:
        flags = (" opt-out" if r.opt_out else "") + (" dry-run" if r.dry_run else "")
        table.add_row(
            *(
                Text(str(x))
                for x in (
                    r.id,
                    r.node,
                    r.xid,
                    "" if r.gpu is None else r.gpu,
                    r.tier,
                    r.state + flags,
                    _backend(r, default_backend),
                    _ts(r.opened_at),
                    r.alert_count,
                    r.reason,
                )
            )
        )
    Console().print(table)


def _backend(inc: IncidentRecord, default: str) -> str:
    """The pool backend the incident's plays use: its pool's or its rule's, else the runner's."""
    from remediation.policy import BACKEND_VAR

    return str(inc.extra_vars.get(BACKEND_VAR) or default)


incident_app = typer.Typer(help="Look at one incident.", no_args_is_help=True)


@incident_app.command("show")
def incident_show(
    incident_id: Annotated[str, typer.Argument(help="Incident id, e.g. inc-0123456789ab.")],
    config: ConfigOpt = DEFAULT_CONFIG,
    as_json: JsonOpt = False,
) -> None:
    """Show an incident, its timeline (phase durations) and its runs."""
    journal = _journal(config)
    inc = journal.incident(incident_id)
    if inc is None:
        raise _fail(f"no incident {incident_id!r}")
    from remediation.cost import costs_from, incident_cost

    timeline = journal.timeline(inc.id)
    runs = journal.runs_of(inc.id)
    if as_json:
        _print_json(
            {
                "incident": inc.as_dict(),
                "timeline": [t.as_dict() for t in timeline],
                "runs": [r.as_dict() for r in runs],
                "cost": incident_cost(timeline),
            }
        )
        return
    console = Console()
    console.print(
        Text(f"{inc.id}  node {inc.node}  XID {inc.xid}  tier {inc.tier}  state {inc.state}  ({inc.reason})")
    )
    table = Table(title="timeline")
    for col in ("at (UTC)", "+s", "phase", "status", "source", "run", "detail"):
        table.add_column(col)
    for t in timeline:
        table.add_row(
            *(
                Text(str(x))
                for x in (
                    _ts(t.ts),
                    f"{t.ts - inc.opened_at:.1f}",
                    t.phase,
                    t.status,
                    t.source,
                    t.run_id or "",
                    t.detail,
                )
            )
        )
    console.print(table)
    costs = costs_from(timeline)
    for c in costs:
        console.print(Text(f"cost: {c.line()}"))
    if costs:
        console.print(Text(f"cost: {sum(c.gpu_hours for c in costs):.4f} GPU-hours lost in all"))
    for r in runs:
        console.print(
            Text(
                f"run {r.id}: {r.playbook} {r.status} rc={r.rc} "
                f"check={r.check_mode} nodes={len(r.nodes)} {r.detail}"
            )
        )


def pause(
    config: ConfigOpt = DEFAULT_CONFIG,
    reason: Annotated[str, typer.Option(help="Why (recorded).")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Pause the runner: alerts are still recorded, no new play starts (running ones finish)."""
    from remediation.manual import set_paused

    set_paused(_journal(config), True, reason)
    if as_json:
        _print_json({"paused": True, "reason": reason})
    else:
        typer.echo("paused")


def resume(config: ConfigOpt = DEFAULT_CONFIG, as_json: JsonOpt = False) -> None:
    """Resume a paused runner."""
    from remediation.manual import set_paused

    set_paused(_journal(config), False)
    if as_json:
        _print_json({"paused": False})
    else:
        typer.echo("resumed")


breaker_app = typer.Typer(help="The latching circuit breaker (storms).", no_args_is_help=True)


@breaker_app.command("status")
def breaker_status(config: ConfigOpt = DEFAULT_CONFIG, as_json: JsonOpt = False) -> None:
    """Show whether the breaker is open, why and since when."""
    from remediation.policy import breaker_state

    journal = _journal(config)
    state = breaker_state(journal)
    held = journal.count_states().get(IncidentState.HELD.value, 0)
    if as_json:
        _print_json({**state.as_dict(), "held_incidents": held})
        return
    typer.echo(
        f"breaker {'OPEN' if state.open else 'closed'}"
        + (f" since {_ts(state.tripped_at)}: {state.reason}" if state.open else "")
        + f"; {held} incident(s) held"
    )
    if state.open:
        raise typer.Exit(1)


@breaker_app.command("reset")
def breaker_reset(
    config: ConfigOpt = DEFAULT_CONFIG,
    reason: Annotated[str, typer.Option(help="Why it is safe now (recorded).")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Close the breaker; held incidents go back to the queue and are decided again."""
    from remediation.manual import reset_breaker

    before, n = reset_breaker(_journal(config), reason)
    if as_json:
        _print_json({"open": False, "was_open": before.open, "requeued": n})
        return
    typer.echo(f"breaker closed (was {'open' if before.open else 'closed'}); {n} held incident(s) requeued")


def cancel(
    incident_id: Annotated[str, typer.Argument(help="Incident id.")],
    config: ConfigOpt = DEFAULT_CONFIG,
    as_json: JsonOpt = False,
) -> None:
    """Cancel an open incident; a running play is stopped at the next check."""
    from remediation.manual import request_cancel

    try:
        inc = request_cancel(_journal(config), incident_id)
    except AutohealError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        _print_json({"incident": inc.id, "state": inc.state, "cancel_requested": True})
        return
    typer.echo(f"cancel requested for {inc.id} ({inc.state})")


def run(
    playbook: Annotated[str, typer.Argument(help="Playbook name, e.g. gpu_fatal_xid.yml.")],
    node: Annotated[str, typer.Option("--node", "-n", help="Node name (validated).")],
    config: ConfigOpt = DEFAULT_CONFIG,
    check: Annotated[bool, typer.Option("--check", help="Check mode: change nothing.")] = False,
    tier: Annotated[
        str, typer.Option(help="restart_app, drain, reset, reboot, replace or quarantine.")
    ] = "reset",
    xid: Annotated[int, typer.Option(min=0, max=999, help="XID to report to the play.")] = 0,
    gpu: Annotated[int | None, typer.Option(min=0, max=63, help="GPU index.")] = None,
    opt_out: Annotated[bool, typer.Option("--opt-out", help="Fence and notify only.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Run a play by hand for one node, recorded in the journal like any incident."""
    from remediation.journal import Journal
    from remediation.manual import run_by_hand

    cfg = _config(config)
    try:
        inc = run_by_hand(
            cfg,
            Journal.configured(cfg.journal_path, cfg.journal_dsn),
            playbook,
            node,
            check=check,
            tier=tier,
            xid=xid,
            gpu=gpu,
            opt_out=opt_out,
        )
    except AutohealError as exc:
        raise _fail(str(exc)) from exc
    if as_json:
        _print_json(inc.as_dict())
    else:
        typer.echo(f"{inc.id}: {inc.state} ({inc.reason})")
    if inc.state is not IncidentState.COMPLETED:
        raise typer.Exit(1)


def leader(config: ConfigOpt = DEFAULT_CONFIG, as_json: JsonOpt = False) -> None:
    """Show which replica leads (claimed the journal last), in which term and since when."""
    from remediation.fencing import LEADER_KEY

    record = _journal(config).setting(LEADER_KEY)
    if as_json:
        _print_json(record or {})
        return
    if not record:
        typer.echo("no replica has claimed this journal (leader election off, or none started yet)")
        return
    typer.echo(f"leader {record['holder']} (term {record['term']}) since {_ts(record.get('since'))}")


def dashboard(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write here (default: stdout).")] = None,
) -> None:
    """Render the runner's Grafana dashboard (built as code: remediation/dashboard.py) to JSON."""
    from remediation.dashboard import render

    text = render()
    if out is None:
        sys.stdout.write(text)
        return
    out.write_text(text)
    typer.echo(f"wrote {out}")


def register(app: typer.Typer) -> None:
    """Add the runner's commands to the root `autoheal` app."""
    app.command()(serve)
    app.command()(incidents)
    app.add_typer(incident_app, name="incident")
    app.command()(pause)
    app.command()(resume)
    app.add_typer(breaker_app, name="breaker")
    app.command()(cancel)
    app.command()(run)
    app.command()(leader)
    app.command()(dashboard)


def main() -> None:
    app = typer.Typer(help="autoheal remediation runner.", no_args_is_help=True)
    register(app)
    app()
