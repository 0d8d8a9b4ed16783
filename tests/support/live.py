"""Helpers for tests against running processes: waiting for terminal states, reading the DB."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from sqlalchemy import create_engine, text

from batchserve.testing.deployment import Stack
from tests.support.inprocess import ASGI_HOST

TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


async def wait_terminal(
    client: httpx.AsyncClient, ids: Iterable[str], timeout_s: float = 60
) -> dict[str, dict[str, Any]]:
    """Long-poll each request until it is terminal; fails the test if one is not in time.

    Against a server on a port the long-polls go out on aiohttp, with ``client``'s address and
    headers: httpx's connection pool scans every connection for each request it places, and a
    hundred long-polls at once cost the test process 3-8 CPU-s per 500 requests (aiohttp:
    0.2-0.4 s), on the two cores the whole suite shares. An in-process app (its client on an
    ASGI transport) is long-polled through ``client`` itself."""
    ids = list(ids)
    if client.base_url.host == ASGI_HOST:
        return await _wait_terminal(_HttpxPoll(client), ids, timeout_s)
    headers = {k: v for k, v in client.headers.items() if k.lower() not in _HTTPX_DEFAULTS}
    async with aiohttp.ClientSession(str(client.base_url).rstrip("/"), headers=headers) as session:
        return await _wait_terminal(_AiohttpPoll(session), ids, timeout_s)


_HTTPX_DEFAULTS = {"accept", "accept-encoding", "connection", "user-agent"}


class _HttpxPoll:
    transport_errors: tuple[type[Exception], ...] = (httpx.TransportError,)

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def get(self, request_id: str) -> tuple[int, Any]:
        response = await self.client.get(f"/v1/requests/{request_id}", params={"wait": 10})
        return response.status_code, response.json() if response.status_code == 200 else None


class _AiohttpPoll:
    transport_errors: tuple[type[Exception], ...] = (aiohttp.ClientConnectionError,)

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def get(self, request_id: str) -> tuple[int, Any]:
        async with self.session.get(f"/v1/requests/{request_id}", params={"wait": "10"}) as answer:
            body = await answer.json() if answer.status == 200 else None
            return answer.status, body


async def _wait_terminal(
    poll: _HttpxPoll | _AiohttpPoll, ids: list[str], timeout_s: float
) -> dict[str, dict[str, Any]]:
    give_up = time.monotonic() + timeout_s
    results: dict[str, dict[str, Any]] = {}

    async def one(request_id: str) -> None:
        while time.monotonic() < give_up:
            try:
                status, body = await poll.get(request_id)
            except poll.transport_errors:
                await asyncio.sleep(0.2)  # the API is restarting
                continue
            if status in (401, 404):
                raise AssertionError(f"request {request_id}: {status} (which tenant?)")
            if status == 200 and body["status"] in TERMINAL:
                results[request_id] = body
                return
            if status >= 500:
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


def stacks_of(pid: int, *, timeout_s: float = 30.0) -> str:
    """Every thread's Python stack in a process and its children (``py-spy dump``), for the
    message of a test that found it stuck: what a hang was waiting on, before it is killed."""
    spy = Path(sys.executable).with_name("py-spy")
    try:
        dumped = subprocess.run(
            [str(spy), "dump", "--pid", str(pid), "--subprocesses"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"(no stacks: {error})"
    return (dumped.stdout or dumped.stderr)[-8000:]
