"""A TCP forwarder for test hosts (:mod:`batchserve.testing.hosts`): listens on the root-side
address of each host's link and pipes every connection to the same port on 127.0.0.1, where the
shared servers listen (they are not reconfigured).

Run as its own process, started and stopped by pid::

    python -m batchserve.testing.tcp_forward --parent PID --ports 5432,5672,6379 ADDRESS...

It binds every ``ADDRESS:PORT`` (or exits 2), prints ``ready``, and exits by itself once
``PID`` is gone (a test process that crashed leaves no forwarder behind). A connection is a
plain byte pipe: a half-close is passed on, an error on one side closes both, and nothing else
is timed out, so a cut link stalls the connection as it would stall a real one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

UPSTREAM = "127.0.0.1"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except Exception:  # a reset, or the other side already closed: close this one too
        writer.close()


async def _serve(port: int, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
    try:
        up_r, up_w = await asyncio.open_connection(UPSTREAM, port)
    except OSError:
        down_w.close()
        return
    try:
        await asyncio.gather(_pipe(down_r, up_w), _pipe(up_r, down_w))
    finally:
        for writer in (up_w, down_w):
            writer.close()
            with contextlib.suppress(OSError, RuntimeError):
                await writer.wait_closed()


async def forward(addresses: list[str], ports: list[int], parent: int) -> int:
    servers = []
    # Each connection's task, held until it ends: a task waiting on a connection that only its
    # own objects refer to would otherwise be garbage-collected while pending.
    connections: set[asyncio.Task[None]] = set()
    try:
        for address in addresses:
            for port in ports:

                async def handle(
                    r: asyncio.StreamReader, w: asyncio.StreamWriter, port: int = port
                ) -> None:
                    task = asyncio.current_task()
                    assert task is not None
                    connections.add(task)
                    try:
                        await _serve(port, r, w)
                    finally:
                        connections.discard(task)

                servers.append(await asyncio.start_server(handle, address, port, backlog=512))
    except OSError as error:
        print(f"tcp_forward: {error}", file=sys.stderr, flush=True)
        return 2
    print("ready", flush=True)
    # Reparented once the parent is gone (a zombie parent still answers kill(pid, 0)).
    while parent <= 0 or os.getppid() == parent:
        await asyncio.sleep(0.5)
    for server in servers:
        server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tcp_forward")
    parser.add_argument("--parent", type=int, default=0, help="exit once this pid is gone")
    parser.add_argument("--ports", required=True, help="comma-separated ports")
    parser.add_argument("--tag", default="", help="a label for ps (the Hosts it serves)")
    parser.add_argument("addresses", nargs="+")
    args = parser.parse_args(argv)
    ports = [int(p) for p in args.ports.split(",") if p]
    try:
        import uvloop

        return uvloop.run(forward(args.addresses, ports, args.parent))
    except ImportError:
        return asyncio.run(forward(args.addresses, ports, args.parent))


if __name__ == "__main__":
    sys.exit(main())
