"""An open-loop load generator: requests leave on a Poisson (or bursty) schedule, never waiting
for earlier answers, so queueing shows up in the latencies instead of slowing the sender.

Uses aiohttp: on two cores httpx's client tops out near 100 requests/s, aiohttp's near 1,000.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Submitted:
    index: int
    sent_at: float  # time.time() when the request left
    status: int
    latency_s: float  # until the 202 (or refusal) came back
    request_id: str | None = None
    body: dict[str, Any] | None = None


@dataclass
class CollectorPauses:
    """The load generator's own garbage collections while it sends: each one stops its loop,
    and every answer that arrives meanwhile is timed that much late, so a step reports them
    beside the latencies it measured."""

    collections: int = 0
    full: int = 0
    longest_ms: float = 0.0
    total_ms: float = 0.0
    _started: float = 0.0

    def _timed(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._started) * 1000.0
        self.collections += 1
        self.full += info["generation"] == 2
        self.longest_ms = max(self.longest_ms, pause_ms)
        self.total_ms += pause_ms

    def __enter__(self) -> CollectorPauses:
        gc.callbacks.append(self._timed)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._timed)

    def as_dict(self) -> dict[str, float]:
        return {
            "collections": self.collections,
            "full": self.full,
            "longest_ms": round(self.longest_ms, 2),
            "ms": round(self.total_ms, 2),
        }


@dataclass
class LoadResult:
    submitted: list[Submitted] = field(default_factory=list)
    errors: int = 0
    collector: CollectorPauses = field(default_factory=CollectorPauses)

    @property
    def accepted(self) -> list[Submitted]:
        return [s for s in self.submitted if s.status == 202]


def poisson_schedule(rate: float, duration_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    times: list[float] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration_s:
            return times
        times.append(at)


async def open_loop(
    url: str,
    schedule: list[float],
    make_body: Callable[[int], dict[str, Any]],
    *,
    path: str = "/v1/requests",
    headers: dict[str, str] | None = None,
    connections: int = 0,
    on_accepted: Callable[[aiohttp.ClientSession, Submitted], Awaitable[None]] | None = None,
    collect: bool = False,
) -> LoadResult:
    """Send one POST at each offset of ``schedule`` (seconds from now); ``on_accepted`` runs
    after each 202 (a chaos run cancels some requests with it; a latency run long-polls).

    ``connections``: aiohttp's pool, unbounded (0) unless given. A bounded pool would make the
    loop closed past capacity: a caller still long-polling holds its connection, so the next
    send waits for one and the service is offered less than the schedule says.

    This process's garbage collector is off while it sends (unless ``collect``), as timing
    tools turn it off: a collection stops the generator, and every answer that arrives
    meanwhile is timed that much late. The bench's process holds every answer of its run, so
    its passes grow long (docs/frontdoor.md, "The load generator timed its own pauses").
    What they would have collected waits for the end of the send: a step's garbage.
    ``result.collector`` says what collections ran while it sent all the same."""
    result = LoadResult()
    paused = not collect and gc.isenabled()
    if paused:
        gc.disable()
    try:
        with result.collector:
            return await _send(
                result, url, schedule, make_body, path, headers, connections, on_accepted
            )
    finally:
        if paused:
            gc.enable()


async def _send(
    result: LoadResult,
    url: str,
    schedule: list[float],
    make_body: Callable[[int], dict[str, Any]],
    path: str,
    headers: dict[str, str] | None,
    connections: int,
    on_accepted: Callable[[aiohttp.ClientSession, Submitted], Awaitable[None]] | None,
) -> LoadResult:
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=timeout, headers=headers
    ) as session:

        async def one(index: int) -> None:
            sent = time.time()
            started = time.perf_counter()
            try:
                async with session.post(path, json=make_body(index)) as response:
                    body = await response.json(content_type=None)
                    result.submitted.append(
                        Submitted(
                            index,
                            sent,
                            response.status,
                            time.perf_counter() - started,
                            body.get("id") if isinstance(body, dict) else None,
                            body if isinstance(body, dict) else None,
                        )
                    )
                if on_accepted is not None and response.status == 202:
                    await on_accepted(session, result.submitted[-1])
            except (TimeoutError, aiohttp.ClientError):
                result.errors += 1

        start = time.perf_counter()
        tasks = []
        for index, offset in enumerate(schedule):
            delay = start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(index)))
        await asyncio.gather(*tasks)
    return result
