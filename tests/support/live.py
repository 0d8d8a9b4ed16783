"""Helpers for tests against running processes: waiting for terminal states, reading the DB."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from batchserve.testing.deployment import Stack

TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


async def wait_terminal(
    client: httpx.AsyncClient, ids: Iterable[str], timeout_s: float = 60
) -> dict[str, dict[str, Any]]:
    """Long-poll each request until it is terminal; fails the test if one is not in time."""
    give_up = time.monotonic() + timeout_s
    results: dict[str, dict[str, Any]] = {}

    async def one(request_id: str) -> None:
        while time.monotonic() < give_up:
            try:
                response = await client.get(f"/v1/requests/{request_id}", params={"wait": 10})
            except httpx.TransportError:
                await asyncio.sleep(0.2)  # the API is restarting
                continue
            if response.status_code in (401, 404):
                raise AssertionError(
                    f"request {request_id}: {response.status_code} (which tenant?)"
                )
            if response.status_code == 200 and response.json()["status"] in TERMINAL:
                results[request_id] = response.json()
                return
            if response.status_code >= 500:
                await asyncio.sleep(0.2)
        raise AssertionError(f"request {request_id} not terminal after {timeout_s}s")

    semaphore = asyncio.Semaphore(100)

    async def bounded(request_id: str) -> None:
        async with semaphore:
            await one(request_id)

    await asyncio.gather(*(bounded(i) for i in ids))
    return results


def db_rows(stack: Stack, sql: str, **params: Any) -> list[Any]:
    url = stack.env["BATCHSERVE_DATABASE_URL"]
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params))
    finally:
        engine.dispose()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every process below it, while they run."""
    total, todo = 0.0, [pid]
    ticks = os.sysconf("SC_CLK_TCK")
    while todo:
        each = todo.pop()
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
            for task in os.listdir(f"/proc/{each}/task"):
                todo += [
                    int(c) for c in Path(f"/proc/{each}/task/{task}/children").read_text().split()
                ]
        except OSError:
            continue  # gone meanwhile
    return total
