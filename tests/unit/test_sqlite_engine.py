"""The embedded database's engine: SQLite's calls on the loop's own thread, one transaction at
a time (``batchserve/core/sqlite.py``)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batchserve.core import sqlite
from batchserve.core.db import autocommit, create_engine, transaction


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncEngine:
    # A regression that lets two transactions meet in SQLite's busy handler fails in a
    # second ("database is locked") rather than stopping the loop for the default 30.
    monkeypatch.setattr(sqlite, "BUSY_TIMEOUT_S", 1.0)
    return create_engine(f"sqlite+aiosqlite:///{tmp_path}/embedded.sqlite3")


async def _prepare(engine: AsyncEngine) -> None:
    async with transaction(engine) as conn:
        await conn.execute(text("CREATE TABLE counter (n INTEGER NOT NULL)"))
        await conn.execute(text("INSERT INTO counter VALUES (0)"))


async def test_statements_run_on_the_loops_thread_and_start_no_thread(
    engine: AsyncEngine,
) -> None:
    threads_before = {t.ident for t in threading.enumerate()}
    try:
        for _ in range(3):
            async with transaction(engine) as conn:
                driver = (await conn.get_raw_connection()).driver_connection
                assert driver is not None
                # SQLite calls this function where it runs the statement.
                driver._conn.create_function("thread", 0, threading.get_ident)
                ran_on = (await conn.execute(text("SELECT thread()"))).scalar_one()
                assert ran_on == threading.get_ident()
        async with autocommit(engine) as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
        assert {t.ident for t in threading.enumerate()} == threads_before
    finally:
        await engine.dispose()


async def test_concurrent_transactions_take_turns_and_every_one_commits(
    engine: AsyncEngine,
) -> None:
    await _prepare(engine)

    async def increment() -> None:
        async with transaction(engine) as conn:
            n = (await conn.execute(text("SELECT n FROM counter"))).scalar_one()
            await asyncio.sleep(0.001)  # suspended inside the transaction: others wait
            await conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})

    async def read() -> int:
        async with autocommit(engine) as conn:
            return int((await conn.execute(text("SELECT n FROM counter"))).scalar_one())

    try:
        results = await asyncio.gather(
            *(increment() for _ in range(40)), *(read() for _ in range(20))
        )
        assert all(isinstance(r, int) for r in results[40:])
        assert await read() == 40  # no update lost, none refused as "database is locked"
    finally:
        await engine.dispose()


async def test_a_transaction_opened_inside_another_is_refused_at_once(
    engine: AsyncEngine,
) -> None:
    try:
        async with transaction(engine):
            with pytest.raises(RuntimeError, match="inside another"):
                async with autocommit(engine):
                    pass
        async with transaction(engine) as conn:  # the first one's turn ended with it
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1
    finally:
        await engine.dispose()


async def test_a_write_by_another_process_is_waited_for(engine: AsyncEngine) -> None:
    await _prepare(engine)
    database = engine.url.database
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({database!r}, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE')\n"
            "c.execute('UPDATE counter SET n = 100')\n"
            "print('holding', flush=True)\n"
            "time.sleep(0.3)\n"
            "c.execute('COMMIT')\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        async with transaction(engine) as conn:  # waits in SQLite's busy handler
            n = (await conn.execute(text("SELECT n FROM counter"))).scalar_one()
            await conn.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
        async with autocommit(engine) as conn:
            assert (await conn.execute(text("SELECT n FROM counter"))).scalar_one() == 101
    finally:
        assert holder.wait(timeout=10) == 0
        await engine.dispose()


def test_one_engine_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/loops.sqlite3")

    async def count() -> int:
        async with transaction(engine) as conn:
            await conn.execute(text("CREATE TABLE IF NOT EXISTS t (x INTEGER)"))
            await conn.execute(text("INSERT INTO t VALUES (1)"))
            return int((await conn.execute(text("SELECT count(*) FROM t"))).scalar_one())

    assert asyncio.run(count()) == 1
    assert asyncio.run(count()) == 2  # a lock of the first loop's would refuse this one
    asyncio.run(engine.dispose())


async def test_a_call_nobody_waits_for_still_fails_where_it_is_made() -> None:
    """What aiosqlite would queue for its thread runs at once: its answer or error goes to the
    future that waits for it, and without one an error is raised, not dropped."""
    run_now = sqlite._RunNow()
    waiting: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    run_now.put_nowait((waiting, lambda: 7))
    assert waiting.result() == 7
    failing: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    run_now.put_nowait((failing, lambda: 1 // 0))
    assert isinstance(failing.exception(), ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        run_now.put_nowait((None, lambda: 1 // 0))
