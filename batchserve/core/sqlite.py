"""The embedded database: SQLite, its calls run on the event loop's own thread, one
transaction at a time.

SQLAlchemy reaches SQLite asynchronously through aiosqlite, which runs every call of a
connection (a cursor, an execute, a fetch, a commit) on a thread of that connection's own and
hands the answer back through the event loop: two thread switches a call, several calls a
statement, dozens of statements a request. In the embedded mode, where every role shares one
process, those hand-overs cost much of a request's CPU and its latency (at 100 requests a
second a p50 of 596-907 ms for batches of 100 ms, 195-225 ms with the calls inline, the CPU a
request 9.5-9.7 ms and 6.8-8.2: docs/frontdoor.md, "The embedded store on the loop's thread").
SQLite's own work for one of these statements is a few microseconds to a few hundred: here
each call runs where it is made, on the loop's thread,
through aiosqlite's interface (:class:`InlineConnection`), and SQLAlchemy sees the same
driver it always did.

One rule comes with it. Every transaction on the file takes SQLite's write lock when it
begins (``BEGIN IMMEDIATE``, :func:`_begin_immediate`), so two at once
cannot both proceed; with calls inline, a second one waiting in SQLite's busy handler would
stop the loop, and with it the first, which then never ends. So this process lets one
transaction at a time have the database (:func:`turn`): the others wait on the loop, which
is also cheaper than the busy handler's sleeps (growing steps of up to 100 ms). Two rules
follow for the store's code: a transaction must not open another one (:func:`turn` says so
at once instead of hanging), and nothing reaches the engine except through
:func:`batchserve.core.db.transaction` and :func:`batchserve.core.db.autocommit`. Another
process writing the same file (``batchserve keys create`` beside a running ``serve``) still
meets the busy handler: the loop then waits for that process's few milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiosqlite
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# How long a statement waits for another process's write to end (SQLite's busy timeout).
BUSY_TIMEOUT_S = 30.0


class _RunNow:
    """Stands where aiosqlite keeps the queue its thread reads: what is put runs at once.
    (SQLAlchemy's adapter puts some calls there directly, bypassing ``_execute``.)"""

    def put_nowait(self, item: tuple[asyncio.Future[Any] | None, Callable[[], Any]]) -> None:
        future, function = item
        try:
            result = function()
        except BaseException as error:
            if future is None:  # nobody waits for it: the caller hears at once
                raise
            future.set_exception(error)
        else:
            if future is not None:
                future.set_result(result)


class InlineConnection(aiosqlite.Connection):
    """aiosqlite's connection, each call run on the caller's thread: no thread of its own."""

    def __init__(self, connector: Callable[[], sqlite3.Connection]) -> None:
        super().__init__(connector, iter_chunk_size=64)
        self._tx = _RunNow()  # type: ignore[assignment]

    def __await__(self) -> Any:
        return self._connect().__await__()

    async def _connect(self) -> InlineConnection:
        if self._connection is None:
            self._connection = self._connector()
        return self

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def stop(self) -> None:
        self._running = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def close(self) -> None:
        self.stop()


def create_sqlite_engine(url: str, database: str) -> AsyncEngine:
    """An async engine on the SQLite file ``database`` (``:memory:`` for none) whose
    connections run their calls inline."""

    def connector() -> sqlite3.Connection:
        # Checked out on the loop's thread; the pool may close one from another (a collected
        # engine), which sqlite3 allows once the check is off.
        return sqlite3.connect(database, timeout=BUSY_TIMEOUT_S, check_same_thread=False)

    async def connect() -> InlineConnection:
        return await InlineConnection(connector)

    engine = create_async_engine(url, async_creator=connect)
    event.listen(engine.sync_engine, "connect", _pragmas)
    event.listen(engine.sync_engine, "begin", _begin_immediate)
    return engine


def _pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy's "begin" event open transactions (pysqlite would defer them itself).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _begin_immediate(conn: Any) -> None:
    """Take SQLite's write lock when a transaction starts, so the store's read-then-write
    transactions serialize like Postgres row locks would make them (SQLite has no FOR UPDATE).
    An autocommit connection begins one too: SQLAlchemy fires the event for it as well."""
    conn.exec_driver_sql("BEGIN IMMEDIATE")


class _Turns:
    """One lock an event loop, and which task holds it."""

    def __init__(self) -> None:
        self.locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self.holders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[Any]] = (
            weakref.WeakKeyDictionary()
        )


_TURNS: weakref.WeakKeyDictionary[Any, _Turns] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def turn(engine: AsyncEngine) -> AsyncIterator[None]:
    """Hold the SQLite database for one transaction (or autocommit connection) of this
    process's event loop; for any other engine, nothing."""
    if engine.dialect.name != "sqlite":
        yield
        return
    turns = _TURNS.get(engine.sync_engine)
    if turns is None:
        turns = _TURNS[engine.sync_engine] = _Turns()
    loop = asyncio.get_running_loop()
    lock = turns.locks.get(loop)
    if lock is None:
        lock = turns.locks[loop] = asyncio.Lock()
    task = asyncio.current_task()
    if lock.locked() and task is not None and turns.holders.get(loop) is task:
        raise RuntimeError(
            "a transaction on the SQLite database opened inside another would wait for it"
            " forever: finish the first one, or do both in one"
        )
    async with lock:
        if task is not None:
            turns.holders[loop] = task
        try:
            yield
        finally:
            turns.holders.pop(loop, None)
