"""Redis and PostgreSQL restarted under load, each a server of the test's own (the shared ones
stay up, so these run beside other tests): every role recovers by itself, nothing is lost."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.conftest import ECHO, chaos_stack, exactly_once, fault_body, traffic
from tests.conftest import client_of
from tests.support.live import wait_terminal
from tests.support.own_servers import OwnPostgres, OwnRedis, own_postgres, own_redis

_clusters = itertools.count(1)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[OwnRedis]:
    with own_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def postgres(run_id: str) -> Iterator[OwnPostgres]:
    with own_postgres(run_id, f"cluster{next(_clusters)}") as server:
        yield server


async def test_redis_restart_under_load_and_long_poll_falls_back(
    redis: OwnRedis, database_url: str, namespace: str, tmp_path: Path
) -> None:
    with chaos_stack(database_url, namespace, tmp_path, BATCHSERVE_REDIS_URL=redis.url) as stack:
        stack.start_all({ECHO: 2})
        async with client_of(stack) as http:
            load = asyncio.create_task(traffic(stack, 100.0, 8.0, seed=20))
            await asyncio.sleep(2.0)
            # The roles talk to this Redis (the API, batcher, worker and maintenance at least).
            assert await asyncio.to_thread(redis.clients) > 4
            await asyncio.to_thread(redis.restart)
            accepted = await load
            results = await wait_terminal(http, accepted, timeout_s=120)
            assert all(r["status"] == "succeeded" for r in results.values())
            # While Redis is away a long-poll still returns when the request finishes (it polls).
            await asyncio.to_thread(redis.stop)
            try:
                request_id = (await http.post("/v1/requests", json=fault_body(-1))).json()["id"]
                started = time.monotonic()
                response = await http.get(f"/v1/requests/{request_id}", params={"wait": 20})
                assert response.json()["status"] == "succeeded"
                assert time.monotonic() - started < 10
                accepted.append(request_id)
            finally:
                await asyncio.to_thread(redis.start)
        exactly_once(stack, accepted)


async def test_postgres_down_is_503_and_everything_reconnects(
    postgres: OwnPostgres, namespace: str, tmp_path: Path
) -> None:
    with chaos_stack(postgres.url, namespace, tmp_path) as stack:
        stack.start_all({ECHO: 2})
        async with client_of(stack) as http:
            before = await traffic(stack, 100.0, 2.0, seed=1)
            await asyncio.to_thread(postgres.stop)
            try:
                down = await http.post("/v1/requests", json=fault_body(0))
                assert down.status_code == 503
                assert down.headers["content-type"].startswith("application/problem+json")
                assert down.json()["code"] == "unavailable" and "retry-after" in down.headers
                poll = await http.get(f"/v1/requests/{before[0]}")
                assert poll.status_code == 503
            finally:
                await asyncio.to_thread(postgres.start)
            after = await traffic(stack, 100.0, 3.0, seed=2)
            results = await wait_terminal(http, before + after, timeout_s=120)
            assert all(r["status"] == "succeeded" for r in results.values())
        exactly_once(stack, before + after)
