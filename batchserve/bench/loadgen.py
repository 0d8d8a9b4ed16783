"""An open-loop load generator: requests leave on a Poisson (or bursty) schedule, never waiting
for earlier answers, so queueing shows up in the latencies instead of slowing the sender.

Uses aiohttp: on two cores httpx's client tops out near 100 requests/s, aiohttp's near 1,000.
"""

from __future__ import annotations

import asyncio
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
class LoadResult:
    submitted: list[Submitted] = field(default_factory=list)
    errors: int = 0

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
) -> LoadResult:
    """Send one POST at each offset of ``schedule`` (seconds from now); ``on_accepted`` runs
    after each 202 (a chaos run cancels some requests with it; a latency run long-polls).

    ``connections``: aiohttp's pool, unbounded (0) unless given. A bounded pool would make the
    loop closed past capacity: a caller still long-polling holds its connection, so the next
    send waits for one and the service is offered less than the schedule says."""
    result = LoadResult()
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
