"""Forward the lab bridge's API port to the API server on loopback.

    python -m lab.nodes.apiproxy --listen 10.X.0.1:PORT --to 127.0.0.1:PORT

The control plane listens on 127.0.0.1, which a node's network namespace cannot reach. Rather than
opening the API server to every interface, this forwards one address of the lab's own bridge to
it, byte for byte (TLS passes through untouched, so client certificates still authenticate).
The API server advertises the bridge address, so pods reach it through the `kubernetes` Service.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib


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


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="lab API server forwarder")
    ap.add_argument("--listen", required=True, type=_addr)
    ap.add_argument("--to", required=True, type=_addr)
    a = ap.parse_args(argv)
    asyncio.run(serve(a.listen, a.to))


if __name__ == "__main__":
    main()
