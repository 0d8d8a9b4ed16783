"""What the token logs hold in Redis under steady traffic, with a finished request's log kept
the whole TTL (as before ``token_log_linger_s``) and only the linger.

    python scripts/bench_tokenlog_memory.py --json > docs/tokenlog-memory.json

Each way starts a bench deployment (API, maintenance, a batcher and a worker of the fixed
100 ms model; ``batchserve/bench/stack.py``) with ``BATCHSERVE_TOKEN_LOG_LINGER_S`` set, offers
``--rate`` single submits a second (open-loop Poisson) for ``--seconds``, and every
``--every`` seconds counts the deployment's token logs in Redis (``SCAN``) and sums their
``MEMORY USAGE``. The steady state is what a deployment holds: requests a second times how
long each request's log lives. Needs ``BATCHSERVE_DATABASE_URL``, ``_BROKER_URL`` and
``_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

import redis.asyncio as aioredis
from bench_broker import machine, report

from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.bench.stack import BenchDeployment, variants
from batchserve.core.settings import load_settings


async def held(client: aioredis.Redis, pattern: str) -> tuple[int, int]:
    """How many token logs match ``pattern``, and their bytes."""
    count = size = 0
    async for key in client.scan_iter(pattern, count=1000):
        count += 1
        size += int(await client.memory_usage(key) or 0)
    return count, size


async def one_way(linger_s: float, rate: float, seconds: float, every: float) -> dict[str, Any]:
    settings = load_settings()
    catalogue = variants(32, 20.0)
    os.environ["BATCHSERVE_TOKEN_LOG_LINGER_S"] = str(linger_s)  # the roles' environment
    deployment = BenchDeployment(settings, catalogue, workers=1)
    variant = catalogue["adaptive"]
    await deployment.start()
    samples: list[dict[str, Any]] = []
    assert settings.redis_url
    client = aioredis.from_url(settings.redis_url)
    try:
        await deployment.start_variant(variant)
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def sample() -> None:
            while True:
                await asyncio.sleep(every)
                count, size = await held(client, f"{deployment.run}.tokens.*")
                samples.append(
                    {"at_s": round(loop.time() - started), "logs": count, "mib": size / 2**20}
                )

        sampler = asyncio.create_task(sample())
        load = await open_loop(
            deployment.url,
            poisson_schedule(rate, seconds, 11),
            lambda i: {"model": variant.name, "input": f"memory {i}"},
            headers=deployment.headers,
        )
        sampler.cancel()
    finally:
        await client.aclose()
        await deployment.stop()
    accepted = len(load.accepted)
    last = samples[-1]
    return {
        "linger_s": linger_s,
        "accepted": accepted,
        "samples": [{**s, "mib": round(s["mib"], 2)} for s in samples],
        "bytes_a_log": round(last["mib"] * 2**20 / max(1, last["logs"])),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=15.0)
    parser.add_argument("--linger", type=float, default=60.0)
    parser.add_argument("--ttl", type=float, default=3600.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ways = [await one_way(s, args.rate, args.seconds, args.every) for s in (args.ttl, args.linger)]
    summary = [
        {
            "linger_s": way["linger_s"],
            "logs_at_end": way["samples"][-1]["logs"],
            "mib_at_end": way["samples"][-1]["mib"],
            "bytes_a_log": way["bytes_a_log"],
        }
        for way in ways
    ]
    report(
        {
            "command": "python scripts/bench_tokenlog_memory.py --json",
            "machine": machine(),
            "rate": args.rate,
            "seconds": args.seconds,
            "ways": ways,
            "summary": summary,
        },
        as_json=args.json,
        line=lambda row: (
            f"linger {row['linger_s']:>6.0f} s: {row['logs_at_end']} logs, "
            f"{row['mib_at_end']} MiB at the end ({row['bytes_a_log']} bytes a log)"
        ),
    )


if __name__ == "__main__":
    asyncio.run(main())
