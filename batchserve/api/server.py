"""The API's HTTP servers: the public one (uvicorn, with bounded read times) and the operators'
listener beside it.

uvicorn closes a connection that stays idle after a response (keep-alive timeout), but a
connection that never finishes sending a request is kept for ever: a client sending its headers
a byte at a time, or nothing at all, holds a socket and a descriptor until the process runs out
(slowloris). :class:`GuardedHttpToolsProtocol` closes a connection whose request line and
headers have not all arrived within ``http_header_timeout_s`` of its first byte (or of the
connection, for one that sends nothing), and one whose body has not all arrived within
``http_body_timeout_s`` of its headers. The handler of a request whose body stops coming hears
a disconnect, as when the client goes away.

The operator endpoints (``/metrics``, ``/dashboard``, ``/dashboard/data``: every tenant's
traffic and recent failures) are never on the public port: :func:`serve_api` serves them on
``metrics_host:metrics_port`` (loopback by default), as every other role serves its metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from batchserve.api.main import create_ops_app
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings

log = get_logger("batchserve.api")


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm(self.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_deadline is None:  # the next request on a kept-alive connection
            self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self.body_timeout_s, "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, after_s: float, part: str) -> None:
        self._disarm()
        self._read_deadline = self.loop.call_later(after_s, self._read_timed_out, part, after_s)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self, part: str, after_s: float) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            log.info("http_read_timeout", part=part, after_s=after_s, client=self.client)
            self.transport.close()


def server_config(
    app: Any, settings: Settings, host: str, port: int, **extra: Any
) -> uvicorn.Config:
    """uvicorn's configuration for the API (the full stack's API role and the embedded mode)."""

    class Protocol(GuardedHttpToolsProtocol):
        header_timeout_s = settings.http_header_timeout_s
        body_timeout_s = settings.http_body_timeout_s

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        loop="asyncio",
        http=Protocol,
        # An idle connection is kept longer than clients keep theirs (httpx 5 s, aiohttp 15 s,
        # proxies 60 s), so the client closes it first: a server closing at the very moment a
        # client sends on it resets that request, which reached no handler and gets no answer.
        timeout_keep_alive=75,
        **extra,
    )


class _Beside(uvicorn.Server):
    """A second listener of the API's process: the public server hears the signals and this
    one stops with it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_api(
    app: FastAPI,
    settings: Settings,
    host: str,
    port: int,
    sockets: list[socket.socket] | None = None,
    **extra: Any,
) -> None:
    """Serve ``app`` on ``host:port`` (or on ``sockets`` already listening) until told to
    stop, and its operator endpoints on the metrics port when one is set (from when the app's
    services have started)."""
    server = uvicorn.Server(server_config(app, settings, host, port, **extra))
    if settings.metrics_port is None:
        await server.serve(sockets=sockets)
        return
    public = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started and not public.done():
        await asyncio.sleep(0.02)
    if public.done():
        await public
        return
    ops_config = uvicorn.Config(
        create_ops_app(app),
        host=settings.metrics_host,
        port=settings.metrics_port,
        log_config=None,
        access_log=False,
        loop="asyncio",
        lifespan="off",
    )
    ops = _Beside(ops_config)
    beside = asyncio.create_task(ops.serve())
    log.info("ops_listening", url=f"http://{settings.metrics_host}:{settings.metrics_port}")
    try:
        await public
    finally:
        ops.should_exit = True
        await beside
