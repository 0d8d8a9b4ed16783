"""A real webhook receiver for tests: an HTTP(S) server on 127.0.0.1 that records every request
and answers as the test scripts it (status, headers, or holding the answer until released)."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field

from aiohttp import web

from batchserve.testing.deployment import free_port


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]  # lower-case names
    body: bytes
    monotonic: float
    wall: float
    host: str | None
    path: str


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: asyncio.Event | None = None  # answer only once this is set


class Receiver:
    """Answers each request with the next scripted :class:`Reply` (then 200s)."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: list[Reply] = []
        self.port = free_port()
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    def url(self, path: str = "/hook", *, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ssl_context)
        await site.start()

    async def stop(self) -> None:
        for reply in self.script:
            if reply.hold is not None:
                reply.hold.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Received]:
        """The first ``count`` requests, once they have arrived."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.received) >= count), timeout_s
            )
        return self.received[:count]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        received = Received(
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            monotonic=time.monotonic(),
            wall=time.time(),
            host=request.headers.get("Host"),
            path=request.path,
        )
        reply = self.script.pop(0) if self.script else Reply()
        async with self._changed:
            self.received.append(received)
            self._changed.notify_all()
        if reply.hold is not None:
            await reply.hold.wait()
        return web.Response(status=reply.status, headers=reply.headers, text="ok")
