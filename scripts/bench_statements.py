"""What one admission and one read of a request cost the caller's CPU, by the two ways the
store can send them to Postgres: SQLAlchemy's async engine, and psycopg's own pool
(``batchserve.core.db.Statements``), which the roles use for these statements.

    python scripts/bench_statements.py --json > docs/frontdoor-statements.json

Needs ``BATCHSERVE_DATABASE_URL`` (a Postgres URL); works in a scratch database of its own,
dropped at the end. Each way runs ``--count`` statements after a warm-up, twice in turn
(A, B, A, B), and reports CPU (``time.process_time``) and wall milliseconds per statement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from batchserve.core.db import Statements, create_engine
from batchserve.core.domain import Lane, SubmitCommand, utcnow
from batchserve.core.migrate import upgrade
from batchserve.core.settings import load_settings
from batchserve.core.store import JobStore


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
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
        result = asyncio.run(_run(scratch_url, args.count))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for row in result["rounds"]:
        print(
            f"{row['way']:>6} {row['statement']:>9}: {row['cpu_ms']:.3f} ms CPU, "
            f"{row['wall_ms']:.3f} ms wall"
        )
    print("pool / engine, CPU:", result["pool_over_engine"])


if __name__ == "__main__":
    main()
