"""Database engines: Postgres through psycopg 3, or the embedded SQLite file.

Beside the SQLAlchemy engine, Postgres deployments get :class:`Statements`: psycopg's own
connection pool, in autocommit, for the few single statements every request pays for (its
admission, its reads). Through SQLAlchemy's async engine one read of a request by its id cost
0.595 ms of the caller's CPU (the checkout, the switch to autocommit and back, the greenlet
hop, compiling and processing), through this pool 0.183 ms (``scripts/bench_statements.py``,
recorded in docs/frontdoor-statements.json).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from batchserve.core.errors import Unavailable
from batchserve.core.sqlite import create_sqlite_engine, turn


def create_engine(
    url: str, *, pool_size: int = 10, max_overflow: int | None = None, pool_timeout: float = 10.0
) -> AsyncEngine:
    """An async engine with settings that suit the dialect.

    Beyond ``pool_size``, up to ``max_overflow`` (default: as many again) more connections
    open when they are needed and close when they are returned. ``max_overflow=0`` keeps the
    pool's connections and makes the rest wait for one (``pool_timeout``): the API's choice,
    as opening and closing a Postgres connection a request under load cost more than queueing
    for one (``bench --scenario frontdoor``).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        return create_sqlite_engine(url, parsed.database or ":memory:")
    connect_args: dict[str, Any] = {"connect_timeout": 5, "application_name": "batchserve"}
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        pool_recycle=1800,
        pool_timeout=pool_timeout,
        connect_args=connect_args,
    )


def is_postgres(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


@contextlib.asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction; connection-level driver failures become :class:`Unavailable`."""
    with _unavailable_on_failure():
        async with turn(engine), engine.begin() as conn:
            yield conn


@contextlib.asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement commits by itself: a single statement costs one
    round trip, without BEGIN and COMMIT around it."""
    with _unavailable_on_failure():
        async with turn(engine), engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")


@contextlib.contextmanager
def _unavailable_on_failure() -> Iterator[None]:
    """Connection-level driver failures become :class:`Unavailable`."""
    try:
        yield
    except (exc.OperationalError, exc.InterfaceError) as error:
        raise Unavailable(
            f"database unavailable: {_first_line(error)}", component="database"
        ) from error
    except exc.DBAPIError as error:
        if error.connection_invalidated:
            raise Unavailable("database connection lost", component="database") from error
        raise
    except exc.TimeoutError as error:  # every pooled connection busy for pool_timeout
        raise Unavailable("database connections all busy", component="database") from error
    except (OSError, TimeoutError) as error:
        raise Unavailable(f"database unreachable: {error}", component="database") from error


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error)
    return text.strip().splitlines()[0] if text.strip() else type(error).__name__


class Statements:
    """Single statements on Postgres, each its own transaction, through psycopg's pool.

    The pool opens on first use, on the running loop; its connections are in autocommit and
    psycopg prepares a statement after a few executions. A connection that fails makes the
    pool check its idle ones, so a restarted server costs one failed statement, not one per
    pooled connection."""

    def __init__(self, url: str, *, size: int = 4, timeout_s: float = 10.0) -> None:
        conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self._pool = AsyncConnectionPool(
            conninfo,
            min_size=1,
            max_size=max(1, size),
            timeout=timeout_s,
            kwargs={"autocommit": True, "connect_timeout": 5, "application_name": "batchserve"},
            open=False,
        )
        self._opening = asyncio.Lock()
        self._opened = False
        self._checking: asyncio.Task[None] | None = None

    async def fetchone(self, sql: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def fetchall(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        if not self._opened:
            await self._open()
        try:
            async with self._pool.connection() as conn:
                cursor = conn.cursor(row_factory=dict_row)
                await cursor.execute(sql, params)
                return await cursor.fetchall() if cursor.description is not None else []
        except PoolTimeout as error:
            raise Unavailable("database connections all busy", component="database") from error
        except psycopg.OperationalError as error:
            self._check_soon()
            raise Unavailable(
                f"database unavailable: {_first_line(error)}", component="database"
            ) from error
        except OSError as error:
            self._check_soon()
            raise Unavailable(f"database unreachable: {error}", component="database") from error

    async def _open(self) -> None:
        async with self._opening:
            if not self._opened:
                await self._pool.open(wait=False)
                self._opened = True

    def _check_soon(self) -> None:
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._check())

    async def _check(self) -> None:
        with contextlib.suppress(Exception):
            await self._pool.check()

    async def close(self) -> None:
        if self._checking is not None:
            self._checking.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._checking
        if self._opened:
            await self._pool.close()
            self._opened = False
