"""Database engines: Postgres through psycopg 3, or the embedded SQLite file."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from batchserve.core.errors import Unavailable


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
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        event.listen(engine.sync_engine, "begin", _sqlite_begin_immediate)
        return engine
    connect_args: dict[str, Any] = {"connect_timeout": 5, "application_name": "batchserve"}
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size if max_overflow is None else max_overflow,
        pool_recycle=1800,
        pool_timeout=pool_timeout,
        connect_args=connect_args,
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event open transactions (pysqlite would defer them itself).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin_immediate(conn: Any) -> None:
    """Take SQLite's write lock when a transaction starts, so the store's read-then-write
    transactions serialize like Postgres row locks would make them (SQLite has no FOR UPDATE)."""
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def is_postgres(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


@contextlib.asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A transaction; connection-level driver failures become :class:`Unavailable`."""
    with _unavailable_on_failure():
        async with engine.begin() as conn:
            yield conn


@contextlib.asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement commits by itself: a single statement costs one
    round trip, without BEGIN and COMMIT around it."""
    with _unavailable_on_failure():
        async with engine.connect() as conn:
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
