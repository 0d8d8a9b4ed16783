"""The Postgres connection pool: a fixed pool makes callers wait, and a wait too long is a 503."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text
from sqlalchemy.pool import QueuePool

from batchserve.api.services import ApiServices
from batchserve.core.db import create_engine, transaction
from batchserve.core.errors import Unavailable
from batchserve.core.settings import Settings


async def test_a_fixed_pool_keeps_its_connections_and_makes_the_rest_wait(
    database_url: str,
) -> None:
    engine = create_engine(database_url, pool_size=2, max_overflow=0, pool_timeout=5.0)
    try:

        async def backend() -> int:
            async with transaction(engine) as conn:
                await asyncio.sleep(0.05)  # all at once: more than the pool holds
                return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())

        pids = await asyncio.gather(*(backend() for _ in range(12)))
        assert len(set(pids)) <= 2  # the same two connections, none opened and closed
        pids += await asyncio.gather(*(backend() for _ in range(12)))
        assert len(set(pids)) <= 2
    finally:
        await engine.dispose()


async def test_waiting_past_the_pool_timeout_is_unavailable_not_a_server_error(
    database_url: str,
) -> None:
    engine = create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=0.2)
    try:
        async with transaction(engine):
            with pytest.raises(Unavailable, match="all busy"):
                async with transaction(engine):
                    pass
    finally:
        await engine.dispose()


async def test_the_api_queues_for_its_own_connections(settings: Settings) -> None:
    services = ApiServices.create(settings)
    try:
        pool = services.adapters.store.engine.pool
        assert isinstance(pool, QueuePool)
        assert pool.size() == 10 and pool._max_overflow == 0
    finally:
        await services.adapters.close()
    wider = ApiServices.create(settings.model_copy(update={"api_db_max_overflow": 5}))
    try:
        assert wider.adapters.store.engine.pool._max_overflow == 5  # type: ignore[attr-defined]
    finally:
        await wider.adapters.close()
