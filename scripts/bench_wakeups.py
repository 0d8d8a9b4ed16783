"""How many times each role wakes up for a request, and what a wake-up costs on this machine.

    python scripts/bench_wakeups.py --json > docs/frontdoor-wakeups.json

Three measurements, one after the other on an otherwise idle machine:

- **a bare wake-up**: an empty uvloop loop that only sleeps (``asyncio.sleep`` at 20 and 100
  wake-ups a second, 3 s each): this process's CPU a wake-up, what the host charges for waking
  a Python process at all;
- **a lone request**: a bench deployment (API, maintenance, a batcher and a worker of the fixed
  100 ms model; ``batchserve/bench/stack.py``), first ``--idle`` seconds without traffic (each
  role's wake-ups and CPU a second), then ``--lone`` requests one at a time (submit, long-poll
  to the end, ``--gap`` seconds apart): each role's wake-ups and CPU a request, its idle rate
  taken off;
- **under load**: the same deployment offered ``--rate`` requests a second (open-loop Poisson,
  each long-polled to its end) for ``--seconds``: each role's wake-ups and CPU a request (idle
  included, as ``batchserve bench`` counts CPU).

A wake-up is a context switch of any of the role's threads and processes (``voluntary`` and
``nonvoluntary_ctxt_switches`` in ``/proc``): each time the kernel ran it again after it
blocked or was preempted. Needs ``BATCHSERVE_DATABASE_URL``, ``_BROKER_URL`` and
``_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import aiohttp
import orjson
import uvloop
from bench_broker import machine, report

from batchserve.bench.latency import TERMINAL
from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.bench.stack import BenchDeployment, variants
from batchserve.core.settings import load_settings


def bare_wakeup_ms(rate: float, seconds: float = 3.0) -> float:
    """CPU milliseconds a wake-up of an otherwise empty uvloop loop."""

    async def sleeps() -> float:
        count = int(rate * seconds)
        started = time.process_time()
        for _ in range(count):
            await asyncio.sleep(1.0 / rate)
        return (time.process_time() - started) * 1000.0 / count

    return uvloop.run(sleeps())


def switches(pids: list[int]) -> int:
    """Context switches so far of every thread of these processes."""
    total = 0
    for process in pids:
        try:
            for thread in os.listdir(f"/proc/{process}/task"):
                with open(f"/proc/{process}/task/{thread}/status") as status:
                    for line in status:
                        if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")):
                            total += int(line.split()[1])
        except OSError:
            continue
    return total


class Meter:
    """Each role's wake-ups and CPU seconds between two readings."""

    def __init__(self, deployment: BenchDeployment) -> None:
        self.deployment = deployment
        self.kinds = {name: name.split(":")[0] for name in deployment.stack.roles}

    def read(self) -> tuple[dict[str, int], dict[str, float], float]:
        """Wake-ups of the processes whose CPU ``BenchDeployment.cpu_s`` counts (a role and
        its children: a worker with its pool), then that CPU."""
        stack = self.deployment.stack
        woke: dict[str, int] = {}
        for name, role in stack.roles.items():
            kind = self.kinds[name]
            woke[kind] = woke.get(kind, 0) + switches([role.pid, *stack.child_pids(name)])
        return woke, self.deployment.cpu_s(), time.monotonic()


def _spent(
    before: tuple[dict[str, int], dict[str, float], float],
    after: tuple[dict[str, int], dict[str, float], float],
) -> tuple[dict[str, float], dict[str, float], float]:
    woke = {k: float(after[0][k] - before[0][k]) for k in after[0]}
    cpu_ms = {k: (after[1][k] - before[1][k]) * 1000.0 for k in after[1]}
    return woke, cpu_ms, after[2] - before[2]


async def _until_done(session: aiohttp.ClientSession, request_id: str) -> None:
    for _ in range(10):
        async with session.get(f"/v1/requests/{request_id}", params={"wait": "30"}) as got:
            body = orjson.loads(await got.read())
        if body.get("status") in TERMINAL:
            return


async def roles(args: argparse.Namespace) -> dict[str, Any]:
    catalogue = variants(32, 20.0)
    deployment = BenchDeployment(load_settings(), catalogue, workers=1)
    variant = catalogue["adaptive"]
    await deployment.start()
    try:
        await deployment.start_variant(variant)
        await asyncio.sleep(3.0)
        meter = Meter(deployment)
        first = meter.read()
        await asyncio.sleep(args.idle)
        woke, cpu_ms, span = _spent(first, meter.read())
        idle = {
            kind: {"wakeups_a_s": woke[kind] / span, "cpu_ms_a_s": cpu_ms[kind] / span}
            for kind in woke
        }
        start = meter.read()
        async with aiohttp.ClientSession(deployment.url, headers=deployment.headers) as session:
            for n in range(args.lone):
                body = {"model": variant.name, "input": f"lone {n}"}
                async with session.post("/v1/requests", json=body) as accepted:
                    request_id = orjson.loads(await accepted.read())["id"]
                await _until_done(session, request_id)
                await asyncio.sleep(args.gap)
        woke, cpu_ms, span = _spent(start, meter.read())
        lone = {
            kind: {
                "wakeups": (woke[kind] - idle[kind]["wakeups_a_s"] * span) / args.lone,
                "cpu_ms": (cpu_ms[kind] - idle[kind]["cpu_ms_a_s"] * span) / args.lone,
            }
            for kind in woke
        }

        async def poll(session: aiohttp.ClientSession, submitted: Submitted) -> None:
            if submitted.request_id is not None:
                await _until_done(session, submitted.request_id)

        start = meter.read()
        load = await open_loop(
            deployment.url,
            poisson_schedule(args.rate, args.seconds, 5),
            lambda n: {"model": variant.name, "input": f"loaded {n}"},
            headers=deployment.headers,
            on_accepted=poll,
        )
        woke, cpu_ms, _ = _spent(start, meter.read())
        answered = len(load.accepted)
        loaded = {
            kind: {"wakeups": woke[kind] / answered, "cpu_ms": cpu_ms[kind] / answered}
            for kind in woke
        }
    finally:
        await deployment.stop()
    return {"idle": idle, "lone": lone, "loaded": loaded, "loaded_answered": answered}


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return round(value, 2) if isinstance(value, float) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=15.0)
    parser.add_argument("--lone", type=int, default=40)
    parser.add_argument("--gap", type=float, default=0.3)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    bare = {f"{rate:g}/s": bare_wakeup_ms(rate) for rate in (20.0, 100.0)}
    measured = asyncio.run(roles(args))
    summary = [
        {
            "role": kind,
            "lone_wakeups": measured["lone"][kind]["wakeups"],
            "lone_cpu_ms": measured["lone"][kind]["cpu_ms"],
            "loaded_wakeups": measured["loaded"][kind]["wakeups"],
            "loaded_cpu_ms": measured["loaded"][kind]["cpu_ms"],
        }
        for kind in measured["lone"]
    ]
    report(
        _rounded(
            {
                "command": "python scripts/bench_wakeups.py --json",
                "machine": machine(),
                "bare_wakeup_cpu_ms": bare,
                "lone_requests": args.lone,
                "rate": args.rate,
                **measured,
                "summary": summary,
            }
        ),
        as_json=args.json,
        line=lambda row: (
            f"{row['role']:>12}: lone {row['lone_wakeups']:.1f} wake-ups, "
            f"{row['lone_cpu_ms']:.2f} ms; at the rate {row['loaded_wakeups']:.1f}, "
            f"{row['loaded_cpu_ms']:.2f} ms a request"
        ),
    )


if __name__ == "__main__":
    main()
