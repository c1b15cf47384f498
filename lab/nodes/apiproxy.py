"""Forward one address to another, byte for byte: the lab's two crossings between host and nodes.

    python -m lab.nodes.apiproxy --listen 10.X.0.1:PORT --to 127.0.0.1:PORT
    python -m lab.nodes.apiproxy --listen 127.0.0.1:PORT --node-port RUN_DIR:NODEPORT

The control plane listens on 127.0.0.1, which a node's network namespace cannot reach. Rather than
opening the API server to every interface, the first form forwards one address of the lab's own
bridge to it (TLS passes through untouched, so client certificates still authenticate). The API
server advertises the bridge address, so pods reach it through the `kubernetes` Service.

The second form is the way in from the host: a Service's NodePort on whichever real node is up
(the lab's nodes come and go as the runbook retires them), tried in order of the nodes' state file,
read again for each connection. Alertmanager posts to the runner's Service through it, as it would
to a cloud load balancer in front of the node ports.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Callable
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


Targets = Callable[[], list[tuple[str, int]]]


async def _connect(
    targets: list[tuple[str, int]],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    for host, port in targets:
        with contextlib.suppress(OSError, TimeoutError):
            return await asyncio.wait_for(asyncio.open_connection(host, port), timeout=2)
    return None


async def serve(listen: tuple[str, int], targets: Targets) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up = await _connect(targets())
        if up is None:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up[1]), _pipe(up[0], writer))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def node_port_targets(run_dir: Path, port: int) -> Targets:
    """The NodePort on every real node of the lab: the system node first (it is never retired),
    then the others in the order of the state file."""
    from lab.nodes import cluster, net

    def targets() -> list[tuple[str, int]]:
        state = json.loads(cluster.state_file(run_dir).read_text())
        lab_net = net.LabNet(**state["net"])
        nodes = sorted(state["nodes"].items(), key=lambda kv: kv[0] != cluster.SYSTEM_NODE)  # it stays
        return [(lab_net.node_ip(int(rec["index"])), port) for _, rec in nodes]

    return targets


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="lab forwarder: the API server, or a NodePort")
    ap.add_argument("--listen", required=True, type=_addr)
    to = ap.add_mutually_exclusive_group(required=True)
    to.add_argument("--to", type=_addr, help="one fixed target HOST:PORT")
    to.add_argument("--node-port", help="RUN_DIR:NODEPORT: the NodePort on whichever real node answers")
    a = ap.parse_args(argv)
    if a.to is not None:
        fixed = [a.to]
        asyncio.run(serve(a.listen, lambda: fixed))
        return
    run_dir, _, port = str(a.node_port).rpartition(":")
    asyncio.run(serve(a.listen, node_port_targets(Path(run_dir), int(port))))


if __name__ == "__main__":
    main()
