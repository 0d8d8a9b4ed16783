"""What one admission and one read of a request cost the caller's CPU, by the two ways the
store can send them to Postgres: SQLAlchemy's async engine, and psycopg's own pool
(``batchserve.core.db.Statements``), which the roles use for these statements.

    python scripts/bench_statements.py --json > docs/frontdoor-statements.json

With ``--encodings``, how a group's rows travel instead: a JSON document of them all (what
the store sends: ``jsonb_to_recordset``), against an array a column (``unnest``, what it sent
before; a lone request went as a plain row of parameters), for the admission INSERT of groups
of 1-64 requests and a batch's results UPDATE of 32: the caller's CPU and the Postgres
backend's (from ``/proc``, so Postgres on this host), a request.

    python scripts/bench_statements.py --encodings --json > docs/frontdoor-encodings.json

Needs ``BATCHSERVE_DATABASE_URL`` (a Postgres URL); works in a scratch database of its own,
dropped at the end. Each way runs ``--count`` statements after a warm-up, twice in turn
(A, B, A, B), and reports CPU (``time.process_time``) and wall milliseconds per statement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from batchserve.core.db import Statements, create_engine
from batchserve.core.domain import ItemResult, Lane, SubmitCommand, Timings, utcnow
from batchserve.core.migrate import upgrade
from batchserve.core.records import command_row, pg_value
from batchserve.core.settings import load_settings
from batchserve.core.store import ItemOutcome, JobStore
from batchserve.core.store import batches as batch_statements
from batchserve.core.store import requests as request_statements


def _command() -> SubmitCommand:
    now = utcnow()
    return SubmitCommand(
        id=uuid.uuid4(),
        tenant="t1",
        model="echo-100ms",
        lane=Lane.INTERACTIVE,
        input="hello",
        messages=None,
        params={"max_tokens": 16},
        created_at=now,
        deadline=now + timedelta(seconds=600),
        prompt_tokens=1,
        max_tokens=16,
    )


async def _measure(operation: Callable[[], Awaitable[Any]], count: int) -> dict[str, float]:
    for _ in range(count // 10):
        await operation()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(count):
        await operation()
    return {
        "cpu_ms": round((time.process_time() - cpu) * 1000.0 / count, 3),
        "wall_ms": round((time.perf_counter() - wall) * 1000.0 / count, 3),
    }


async def _run(url: str, count: int) -> dict[str, Any]:
    engine = create_engine(url, pool_size=2)
    statements = Statements(url, size=2)
    through_engine, through_pool = JobStore(engine), JobStore(engine, statements=statements)
    try:
        [admitted] = await through_engine.submit([_command()])
        request_id = admitted.record.id  # type: ignore[union-attr]
        ways: dict[str, dict[str, Callable[[], Awaitable[Any]]]] = {
            "engine": {
                "read": lambda: through_engine.get(request_id, "t1"),
                "admission": lambda: through_engine.submit([_command()]),
            },
            "pool": {
                "read": lambda: through_pool.get(request_id, "t1"),
                "admission": lambda: through_pool.submit([_command()]),
            },
        }
        rounds: list[dict[str, Any]] = []
        for _ in range(2):
            for way, operations in ways.items():
                for name, operation in operations.items():
                    rounds.append(
                        {"way": way, "statement": name, **await _measure(operation, count)}
                    )
    finally:
        await statements.close()
        await engine.dispose()
    best: dict[str, float] = {}  # the lower of each way's two rounds: the quieter machine
    for row in rounds:
        key = f"{row['way']}_{row['statement']}"
        best[key] = min(row["cpu_ms"], best.get(key, math.inf))
    ratios = {
        name: round(best[f"pool_{name}"] / best[f"engine_{name}"], 3)
        for name in ("read", "admission")
    }
    return {"count": count, "rounds": rounds, "cpu_ms_lowest": best, "pool_over_engine": ratios}


ADMISSION_GROUPS = (1, 4, 16, 64)
RESULT_BATCH = 32


def _arrays_insert() -> str:
    """The admission INSERT as the store sent it before: an array parameter a column."""
    columns = request_statements._INSERT_COLUMNS
    arrays = ", ".join(f"CAST(%({name})s AS {kind}[])" for name, kind in columns)
    return (
        "INSERT INTO requests (" + ", ".join(name for name, _ in columns) + ")"
        f" SELECT * FROM unnest({arrays})"
        " ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING id"
    )


def _arrays_rows(commands: list[SubmitCommand]) -> dict[str, list[Any]]:
    rows = [command_row(c) for c in commands]
    return {
        name: [pg_value(name, row[name]) for row in rows]
        for name, _ in request_statements._INSERT_COLUMNS
    }


def _plain_insert() -> str:
    """The admission INSERT of a lone request as the store sent it before: a parameter a
    column, no arrays."""
    columns = request_statements._INSERT_COLUMNS
    return (
        "INSERT INTO requests ("
        + ", ".join(name for name, _ in columns)
        + ") VALUES ("
        + ", ".join(f"%({name})s" for name, _ in columns)
        + ") ON CONFLICT (tenant, idempotency_key) DO NOTHING RETURNING id"
    )


def _plain_row(commands: list[SubmitCommand]) -> dict[str, Any]:
    row = command_row(commands[0])
    return {name: pg_value(name, row[name]) for name, _ in request_statements._INSERT_COLUMNS}


def _results_update(source: str) -> str:
    """A batch's results UPDATE from ``source`` (its rows as ``v``); it matches no request,
    so what is measured is sending and reading the rows."""
    columns = batch_statements._RESULT_COLUMNS
    return (
        "UPDATE requests AS r SET "
        + ", ".join(f"{name} = v.{name}" for name, _ in columns[1:])
        + f" FROM {source} WHERE r.id = v.id AND r.batch_id = %(batch_id)s"
    )


def _arrays_results(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {name: [r[f"b_{name}"] for r in rows] for name, _ in batch_statements._RESULT_COLUMNS}


def _result_rows() -> list[dict[str, Any]]:
    now = utcnow()
    timings = Timings(1.0, 30.0, 100.2, 131.5, ttft_ms=131.5)
    answer = "A short answer of a few sentences, as a chat model writes them. " * 4
    return [
        batch_statements.result_row(
            ItemOutcome(ItemResult(str(uuid.uuid4()), answer, "stop", 12, 40), timings), now
        )
        for _ in range(RESULT_BATCH)
    ]


def _backend_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _encodings(url: str, count: int) -> dict[str, Any]:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    cursor = await conn.execute("SELECT pg_backend_pid()")
    backend = (await cursor.fetchone() or (0,))[0]
    json_update = _results_update(batch_statements._results_from("%(rows)s"))
    arrays_update = _results_update(
        "unnest("
        + ", ".join(
            f"CAST(%({name})s AS {kind}[])" for name, kind in batch_statements._RESULT_COLUMNS
        )
        + ") AS v("
        + ", ".join(name for name, _ in batch_statements._RESULT_COLUMNS)
        + ")"
    )
    ways: dict[str, dict[str, tuple[str, Callable[[int], Any], int]]] = {
        "json": {
            **{
                f"admission of {n}": (
                    request_statements._INSERT_JSON_PSYCOPG,
                    lambda n: request_statements._json_rows([_command() for _ in range(n)]),
                    n,
                )
                for n in ADMISSION_GROUPS
            },
            f"results of {RESULT_BATCH}": (
                json_update,
                lambda _: {
                    "rows": batch_statements.results_document(_result_rows()),
                    "batch_id": uuid.uuid4(),
                },
                RESULT_BATCH,
            ),
        },
        "arrays": {
            # A lone request went as a plain row, a group as arrays.
            "admission of 1": (_plain_insert(), lambda _: _plain_row([_command()]), 1),
            **{
                f"admission of {n}": (
                    _arrays_insert(),
                    lambda n: _arrays_rows([_command() for _ in range(n)]),
                    n,
                )
                for n in ADMISSION_GROUPS
                if n > 1
            },
            f"results of {RESULT_BATCH}": (
                arrays_update,
                lambda _: {**_arrays_results(_result_rows()), "batch_id": uuid.uuid4()},
                RESULT_BATCH,
            ),
        },
    }
    rounds: list[dict[str, Any]] = []
    try:
        for _ in range(2):
            for statement in ways["json"]:
                for way, statements in ways.items():
                    sql, make, size = statements[statement]
                    times = max(20, count // size)
                    # The parameters are built outside the measured loop: the rows themselves
                    # cost the same either way; what differs is sending them.
                    params = [make(size) for _ in range(times + times // 10)]
                    for p in params[times:]:
                        await conn.execute(sql, p, prepare=True)
                    cpu, pg_cpu = time.process_time(), _backend_cpu_s(backend)
                    for p in params[:times]:
                        await conn.execute(sql, p, prepare=True)
                    requests = times * size
                    rounds.append(
                        {
                            "way": way,
                            "statement": statement,
                            "caller_cpu_ms": round(
                                (time.process_time() - cpu) * 1000.0 / requests, 4
                            ),
                            "postgres_cpu_ms": round(
                                (_backend_cpu_s(backend) - pg_cpu) * 1000.0 / requests, 4
                            ),
                        }
                    )
    finally:
        await conn.close()
    return {"count": count, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--encodings", action="store_true", help="JSON document against arrays")
    args = parser.parse_args()
    url = load_settings().database_url
    if not url or make_url(url).get_backend_name() != "postgresql":
        raise SystemExit("set BATCHSERVE_DATABASE_URL to a Postgres database")
    scratch = f"{make_url(url).database or 'batchserve'}_statements_{secrets.token_hex(3)}"
    admin = make_url(url).set(drivername="postgresql", database="postgres")
    admin_url = admin.render_as_string(hide_password=False)
    scratch_url = make_url(url).set(database=scratch).render_as_string(hide_password=False)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{scratch}"')
    try:
        upgrade(scratch_url)
        run = _encodings if args.encodings else _run
        result = asyncio.run(run(scratch_url, args.count))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    if args.json:
        print(json.dumps(result, indent=2))
        return
    if args.encodings:
        for row in result["rounds"]:
            print(
                f"{row['way']:>6} {row['statement']:>16}: caller {row['caller_cpu_ms']:.4f} ms,"
                f" Postgres {row['postgres_cpu_ms']:.4f} ms CPU a request"
            )
        return
    for row in result["rounds"]:
        print(
            f"{row['way']:>6} {row['statement']:>9}: {row['cpu_ms']:.3f} ms CPU, "
            f"{row['wall_ms']:.3f} ms wall"
        )
    print("pool / engine, CPU:", result["pool_over_engine"])


if __name__ == "__main__":
    main()
