"""Clients that open connections and never finish a request (slowloris): the API closes them
within its read deadlines and keeps answering everyone else meanwhile."""

from __future__ import annotations

import asyncio
import os
import time

import httpx

from batchserve.testing.deployment import Stack
from tests.support import keys
from tests.support.live import db_rows

HEADER_S, BODY_S = 1.0, 2.0
READ_LIMITS = {
    "BATCHSERVE_HTTP_HEADER_TIMEOUT_S": str(HEADER_S),
    "BATCHSERVE_HTTP_BODY_TIMEOUT_S": str(BODY_S),
}


async def _eof(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(), timeout_s)
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 4")


async def _slow_headers(port: int, drip: bytes, seconds: float) -> bool:
    """A connection sending ``drip`` a byte every 0.1 s; whether the server closed it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        give_up = time.monotonic() + seconds
        for byte in drip:
            if reader.at_eof() or time.monotonic() > give_up:
                break
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                return True
            await asyncio.sleep(0.1)
        return await _eof(reader, max(0.1, give_up - time.monotonic()))
    finally:
        writer.close()


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def test_connections_that_never_finish_their_headers_are_closed(stack: Stack) -> None:
    stack.start_api(env=READ_LIMITS)
    port = stack.port
    # Headers a byte every 0.1 s that never end: 100 bytes would take 10 s.
    endless = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 100
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    half = []
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        half.append((reader, writer))
    started = time.monotonic()
    dripping = [asyncio.create_task(_slow_headers(port, endless, 8.0)) for _ in range(200)]
    closed = await asyncio.gather(
        *(_eof(r, HEADER_S + 4) for r, _ in silent), *(_eof(r, HEADER_S + 4) for r, _ in half)
    )
    assert all(closed), f"{closed.count(False)} of 40 idle or half-sent connections still open"
    assert all(await asyncio.gather(*dripping)), "a dripping connection was never closed"
    assert time.monotonic() - started < 8.0  # closed at the deadline, not when they gave up
    for _, writer in silent + half:
        writer.close()
    log = (stack.log_dir / "api.log").read_text()
    assert "http_read_timeout" in log and "part=headers" in log


async def test_a_body_that_stops_coming_is_cut_and_stores_nothing(stack: Stack) -> None:
    stack.start_api(env=READ_LIMITS)
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
    body = b'{"model": "echo-100ms", "input": "never finished"}'
    writer.write(
        b"POST /v1/requests HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Authorization: {keys.auth()['Authorization']}\r\n".encode()
        + f"Content-Length: {len(body) + 100}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    started = time.monotonic()
    assert await _eof(reader, BODY_S + 4)
    assert time.monotonic() - started < BODY_S + 3
    writer.close()
    assert db_rows(stack, "SELECT count(*) FROM requests")[0][0] == 0
    assert "part=body" in (stack.log_dir / "api.log").read_text()


async def test_the_api_keeps_serving_while_1000_slow_connections_come_and_go(
    stack: Stack,
) -> None:
    stack.start_api(env=READ_LIMITS)
    api_pid = stack.roles["api"].pid
    baseline_fds = _open_fds(api_pid)
    endless = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100
    latencies: list[float] = []
    failures: list[str] = []
    stop = asyncio.Event()

    async def serve_others() -> None:
        async with httpx.AsyncClient(base_url=stack.url, headers=keys.auth()) as client:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    answer = await client.get("/v1/models", timeout=5)
                    if answer.status_code != 200:
                        failures.append(str(answer.status_code))
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))
                latencies.append(time.monotonic() - began)
                await asyncio.sleep(0.05)

    others = asyncio.create_task(serve_others())
    # Five waves of 200, each wave's connections dripping until the server closes them.
    peak = 0
    for _ in range(5):
        wave = [asyncio.create_task(_slow_headers(stack.port, endless, 6.0)) for _ in range(200)]
        await asyncio.sleep(0.5)
        peak = max(peak, _open_fds(api_pid))
        assert all(await asyncio.gather(*wave))
    stop.set()
    await others
    assert failures == []
    assert len(latencies) > 20
    slowest = sorted(latencies)[int(0.99 * (len(latencies) - 1))]
    print(
        f"\n1,000 slowloris connections in 5 waves: {len(latencies)} requests of others "
        f"served, p99 {slowest * 1000:.0f} ms; API descriptors {baseline_fds} at rest, peak {peak}"
    )
    assert slowest < 2.0
    assert peak > baseline_fds + 150  # the waves did reach the server
    give_up = time.monotonic() + 5
    while _open_fds(api_pid) > baseline_fds + 5 and time.monotonic() < give_up:
        await asyncio.sleep(0.1)
    assert _open_fds(api_pid) <= baseline_fds + 5  # every one of them let go
