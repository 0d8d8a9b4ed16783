"""What writing the token log costs the process that writes it, by the way it is written.

    python scripts/bench_tokenlog_write.py --json > docs/tokenlog-write.json

Every request's state changes go to its token log (``batchserve/core/tokenlog.py``): the
batcher writes each request's ``running``, the worker its end. A writer gathers what was
appended and writes it in one round trip; two ways, each writing the same entries, as a
batch's life does (``--entries`` requests' ``running``, which makes their logs, in one write;
then their answers and their ends, which give each log its linger, in another),
``--batches`` times a round:

- **pipeline**: two commands an entry in one pipeline (``XADD``, then ``EXPIRE`` for the
  logs it may have made and those that ended): how the log was written until the change in
  docs/frontdoor.md, "The token log in one script call";
- **script**: :class:`batchserve.core.tokenlog.RedisTokenLog`, one script call a write.

For each: this process's CPU an entry (``time.process_time``: redis-py's packing and parsing)
and Redis's (its processes' from ``/proc``). The ways alternate, ``--rounds`` rounds, after
one unmeasured round of each. Needs ``BATCHSERVE_REDIS_URL`` (a local Redis: its CPU is read
from this host's ``/proc``); its keys are named ``bench-tokenlog-<random>`` and deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import statistics
import time
from typing import Any

import redis.asyncio as aioredis
from bench_broker import machine, report

from batchserve.bench.stack import server_cpu_per, server_cpu_s
from batchserve.core.domain import RequestState, StateChange
from batchserve.core.settings import load_settings
from batchserve.core.tokenlog import (
    LogEntry,
    RedisTokenLog,
    TokenLogConfig,
    ends,
    state_entries,
)

WAYS = ("pipeline", "script")
CONFIG = TokenLogConfig()


async def pipeline_write(
    client: aioredis.Redis, key: Any, entries: list[tuple[str, LogEntry, bool]]
) -> None:
    """The entries as the log wrote them before: ``XADD`` each, then ``EXPIRE`` each log it
    may have made (the hour; each is new here) or that ended (the linger)."""
    pipe = client.pipeline(transaction=False)
    made: set[str] = set()
    ended: set[str] = set()
    for request_id, entry, create in entries:
        fields: Any = entry.fields()
        pipe.xadd(
            key(request_id),
            fields,
            maxlen=CONFIG.max_entries,
            approximate=True,
            nomkstream=not create,
        )
        if create:
            made.add(key(request_id))
        if ends(entry):
            ended.add(key(request_id))
    for name in made - ended:
        pipe.expire(name, int(CONFIG.ttl_s))
    for name in ended:
        pipe.expire(name, max(1, math.ceil(CONFIG.kept_after_end_s)))
    await pipe.execute()


async def one_round(url: str, way: str, batches: int, size: int) -> dict[str, Any]:
    prefix = f"bench-tokenlog-{secrets.token_hex(4)}"
    log = RedisTokenLog(url, prefix, CONFIG)
    client = aioredis.from_url(url)
    servers_before = server_cpu_s()
    started = time.process_time()
    try:
        for batch in range(batches):
            ids = tuple(f"{batch}-{n}" for n in range(size))
            for write in _writes(ids, f"b{batch}"):
                if way == "script":  # as the roles append: a change's entries at once
                    for create in (False, True):
                        log.append([(r, e) for r, e, c in write if c is create], create=create)
                    await log.flush()
                else:
                    await pipeline_write(client, log.key, write)
        cpu_s = time.process_time() - started
        servers = server_cpu_per(servers_before, server_cpu_s(), 3 * batches * size)
    finally:
        async for key in client.scan_iter(match=f"{prefix}.*", count=1000):
            await client.delete(key)
        await client.aclose()
        await log.close()
    entries = 3 * batches * size
    return {
        "way": way,
        "entries": entries,
        "writer_us_per_entry": round(cpu_s * 1e6 / entries, 2),
        "redis_us_per_entry": round(servers["redis"] * 1000.0, 2),
    }


def _writes(ids: tuple[str, ...], batch: str) -> list[list[tuple[str, LogEntry, bool]]]:
    """A batch's writes to its requests' logs: the batcher's (each one running, which makes
    its log), then the worker's (each answer, to a log that exists, and each end)."""
    running = StateChange(ids, RequestState.RUNNING, batch_id=batch)
    ended = StateChange(ids, RequestState.SUCCEEDED, batch_id=batch)
    answers = [(r, LogEntry.delta(batch, f"answer {r}"), False) for r in ids]
    return [
        [(r, e, True) for r, e in state_entries(running)],
        answers + [(r, e, True) for r, e in state_entries(ended)],
    ]


def summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for way in WAYS:
        mine = [r for r in rounds if r["way"] == way]
        writer = [r["writer_us_per_entry"] for r in mine]
        redis_us = [r["redis_us_per_entry"] for r in mine]
        rows.append(
            {
                "way": way,
                "writer_us_per_entry": writer,
                "writer_median": round(statistics.median(writer), 2),
                "redis_us_per_entry": redis_us,
                "redis_median": round(statistics.median(redis_us), 2),
            }
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--entries", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    url = load_settings().redis_url
    if not url:
        raise SystemExit("set BATCHSERVE_REDIS_URL (a local Redis)")
    for way in WAYS:  # warm-up: connections, the script's load
        await one_round(url, way, 10, args.entries)
    rounds = [
        await one_round(url, way, args.batches, args.entries)
        for _ in range(args.rounds)
        for way in WAYS
    ]
    report(
        {
            "command": "python scripts/bench_tokenlog_write.py --json",
            "machine": machine(),
            "batches": args.batches,
            "entries": args.entries,
            "rounds": rounds,
            "summary": summarize(rounds),
        },
        as_json=args.json,
        line=lambda row: (
            f"{row['way']:>8}: the writer's CPU us an entry {row['writer_us_per_entry']} "
            f"(median {row['writer_median']}); Redis's {row['redis_us_per_entry']} "
            f"(median {row['redis_median']})"
        ),
    )


if __name__ == "__main__":
    asyncio.run(main())
