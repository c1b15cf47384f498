"""`autoheal lab demo`: the lab's story in one command.

For now: bring the lab up, show its health, raise XID 79 on a GPU and show the alert arriving at
the runner's webhook address through the real Prometheus and Alertmanager, with the latency.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoheal.lab import lab as labmod
from autoheal.lab.config import LabConfig
from autoheal.lab.sink import WebhookSink

DEMO_NODE, DEMO_GPU, DEMO_XID = "gpu-2", 3, 79


def run_demo(name: str, root: Path | None, keep: bool, console: Console, out: Console) -> None:
    kw = {"root": root} if root else {}
    cfg = LabConfig(name=name, **kw)  # type: ignore[arg-type]
    t0 = time.monotonic()
    cfg = labmod.up(cfg, lambda m: console.print(f"[dim]lab[/dim] {m}"))
    console.print(f"lab up in {time.monotonic() - t0:.1f}s")
    st = labmod.status(cfg)
    t = Table(title=f"lab {cfg.name}")
    t.add_column("service")
    t.add_column("state")
    for s in st.services:
        t.add_row(s.name, ("ok " if s.healthy else "DOWN ") + s.detail)
    out.print(t)
    token = (cfg.run_dir / "runner.token").read_text().strip()
    sink = WebhookSink(cfg.port("runner"), token).start()
    try:
        labmod.inject(cfg, DEMO_NODE, DEMO_GPU, None)
        time.sleep(2)  # let a clean scrape land so the alert is a fresh one
        console.print(f"injecting XID {DEMO_XID} on {DEMO_NODE} GPU {DEMO_GPU}")
        t_inject = time.time()
        labmod.inject(cfg, DEMO_NODE, DEMO_GPU, DEMO_XID)
        d = sink.wait_for({"Hostname": DEMO_NODE, "xid": str(DEMO_XID)}, 30, since=t_inject)
        alert = next(a for a in d.payload["alerts"] if a["labels"].get("Hostname") == DEMO_NODE)
        out.print(
            f"[bold]alert arrived[/bold] after {d.at - t_inject:.2f}s: "
            f"{alert['labels']['alertname']} node={alert['labels']['Hostname']} "
            f"gpu={alert['labels']['gpu']} xid={alert['labels']['xid']} tier={alert['labels'].get('tier')}"
        )
        labmod.inject(cfg, DEMO_NODE, None, None)
    finally:
        sink.stop()
        if not keep:
            labmod.down(cfg)
            console.print("lab down (use --keep to leave it up)")
