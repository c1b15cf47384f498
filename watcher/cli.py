"""`autoheal watch`: run the XID watcher on this node (registered through the `autoheal.cli`
entry-point group, like the runner's and the lab's commands; `python -m watcher` runs it alone).

Every option has an environment variable, so a DaemonSet sets them from its pod spec (the node
name from the downward API)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

# config fields whose command-line option is named differently
OPTION_OF = {
    "alertmanagers": "alertmanager",
    "state_file": "state",
    "rate_per_second": "rate",
    "alert_hold_seconds": "hold-seconds",
}


def watch(
    node: Annotated[str, typer.Option(envvar="NODE_NAME", help="This node's name (the Hostname label).")],
    alertmanager: Annotated[
        list[str],
        typer.Option(
            "--alertmanager", envvar="AUTOHEAL_ALERTMANAGER", help="Alertmanager base URL (repeat for HA)."
        ),
    ],
    state_file: Annotated[
        Path,
        typer.Option(
            "--state", envvar="AUTOHEAL_WATCH_STATE", help="State file (cursor + undelivered alerts)."
        ),
    ],
    source: Annotated[
        str, typer.Option(envvar="AUTOHEAL_WATCH_SOURCE", help="kmsg | journald | file")
    ] = "kmsg",
    path: Annotated[
        Path | None,
        # readable=False: click's own check (access(2)) would say "not readable" without the reason
        typer.Option(envvar="AUTOHEAL_WATCH_PATH", readable=False, help="kmsg device/file or text log."),
    ] = None,
    gpu_map: Annotated[
        str,
        typer.Option(envvar="AUTOHEAL_WATCH_GPU_MAP", help="auto | nvidia-smi | procfs | none | file:PATH"),
    ] = "auto",
    listen: Annotated[
        str, typer.Option(envvar="AUTOHEAL_WATCH_LISTEN", help="HOST:PORT for /metrics and /healthz.")
    ] = "",
    token_file: Annotated[
        Path | None, typer.Option(envvar="AUTOHEAL_WATCH_TOKEN_FILE", help="Bearer token for Alertmanager.")
    ] = None,
    replay_seconds: Annotated[float, typer.Option(help="First start: replay this much of the log.")] = 300.0,
    rate: Annotated[float, typer.Option(help="Alertmanager POSTs per second, at most.")] = 5.0,
    resend_seconds: Annotated[float, typer.Option(help="Re-post a still-active alert this often.")] = 60.0,
    hold_seconds: Annotated[float, typer.Option(help="An alert ends this long after its last line.")] = 300.0,
    boot_id_file: Annotated[Path, typer.Option(help="Where the boot id is read.")] = Path(
        "/proc/sys/kernel/random/boot_id"
    ),
    sysfs_root: Annotated[
        Path | None,
        typer.Option(
            envvar="AUTOHEAL_WATCH_SYSFS_ROOT",
            help="sysfs root to watch links and PCIe under (/sys on a node); unset: not watched.",
        ),
    ] = None,
    link_poll_seconds: Annotated[float, typer.Option(help="How often sysfs is read.")] = 1.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Watch the kernel log for NVIDIA Xid/SXid lines and post alerts straight to Alertmanager."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per post is noise; failures are logged
    raw: dict[str, Any] = {
        "node": node,
        "source": source,
        "path": path,
        "alertmanagers": alertmanager,
        "token_file": token_file,
        "state_file": state_file,
        "gpu_map": gpu_map,
        "listen": listen,
        "boot_id_file": boot_id_file,
        "replay_seconds": replay_seconds,
        "rate_per_second": rate,
        "resend_seconds": resend_seconds,
        "alert_hold_seconds": hold_seconds,
        "sysfs_root": sysfs_root,
        "link_poll_seconds": link_poll_seconds,
    }
    # imported here, not by every `autoheal` command (the watcher runs its own process)
    from pydantic import ValidationError

    from watcher.config import WatcherConfig

    try:
        cfg = WatcherConfig.model_validate(raw)
    except ValidationError as exc:
        for e in exc.errors():
            field = str(e["loc"][0]) if e["loc"] else ""
            option = OPTION_OF.get(field, field.replace("_", "-"))
            typer.echo(f"error: {'--' + option + ': ' if option else ''}{e['msg']}", err=True)
        raise typer.Exit(2) from None
    refused = _refused(cfg.path or Path("/dev/kmsg")) if cfg.source == "kmsg" else None
    if refused:
        typer.echo(f"error: --path: {refused}", err=True)
        raise typer.Exit(2)
    from watcher.daemon import Watcher

    w = Watcher(cfg)
    signal.signal(signal.SIGTERM, lambda *_: w.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: w.stop_event.set())
    w.run_forever()


def _refused(path: Path, opener: Callable[[Path, int], int] = os.open) -> str | None:
    """Why the kernel log cannot be opened for reading, if it exists and cannot: a watcher that
    may never read it stops at once (a DaemonSet crash-loops, loudly) rather than running blind.
    A log that does not exist yet (a simulator's file) is waited for by the source."""
    try:
        os.close(opener(path, os.O_RDONLY | os.O_NONBLOCK))
    except FileNotFoundError:
        return None
    except OSError as exc:
        hint = ""
        if exc.errno in (errno.EPERM, errno.EACCES) and path.is_char_device():
            hint = (
                " (reading /dev/kmsg needs the device allowed in the container's device cgroup, which a"
                " Kubernetes pod gets from privileged: true or a device plugin, and CAP_SYSLOG where"
                " kernel.dmesg_restrict=1; docs/operations.md, Privileges)"
            )
        return f"{path}: {exc.strerror}{hint}"
    return None


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)


def main() -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(watch)
    app()


__all__ = ["main", "register", "watch"]
