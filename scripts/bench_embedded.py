"""The embedded mode (``batchserve serve`` with no servers configured) under the front door's
load: where a lone request's time goes, and what a request costs the one process at a rate.

    python scripts/bench_embedded.py --json > docs/frontdoor-embedded.json

The embedded mode is every role in one process on a SQLite file: an in-process batcher that
is durable, the thing issue 19 measures the full stack against. This starts it on a fresh
home directory with the seeds' model (``echo-100ms``: every batch 100 ms, up to 32 requests),
then:

- **lone requests**, one at a time, 0.3 s apart: each submitted (``POST /v1/requests``, its
  202 once committed) and long-polled to its end; from the client's clock and the request's
  own ``created_at`` and ``finished_at``: the submit's round trip, acceptance to the end of
  its batch (the model's 100 ms and the batcher's and the store's steps around it), and that
  end to the caller holding the answer;
- **open-loop rates** (Poisson, each request submitted and long-polled, as the front door's
  long-poll path): latency from send to answer, and the process's CPU a request.

Each round starts the service afresh. Needs nothing but this checkout's environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from benchmarks_docs import recorded_runs

from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.bench.stack import _cpu_s, percentile
from batchserve.testing.deployment import free_port, terminate

MODEL = "echo-100ms"
REGISTRY = f"""
[models.{MODEL}]
backend = "fixed"
batch_time_ms = 100
max_batch_size = 32
policy = "adaptive"
"""
# Settings that would point the service at servers: unset, so it runs embedded.
SERVER_SETTINGS = ("BATCHSERVE_DATABASE_URL", "BATCHSERVE_BROKER_URL", "BATCHSERVE_REDIS_URL")


class Embedded:
    """``batchserve serve`` on a fresh home directory, no servers, auth off."""

    def __init__(self, home: Path) -> None:
        registry = home / "models.toml"
        registry.write_text(REGISTRY)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in SERVER_SETTINGS}
        env.update(
            BATCHSERVE_HOME=str(home / "home"),
            BATCHSERVE_MODELS=str(registry),
            BATCHSERVE_AUTH="disabled",
        )
        command = [sys.executable, "-m", "batchserve.cli", "serve", "--port", str(self.port)]
        command += ["--ops-port", str(free_port())]
        self.log = (home / "serve.log").open("wb")
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the embedded service did not start: {home / 'serve.log'}")
            time.sleep(0.2)

    def cpu_s(self) -> float:
        return _cpu_s(self.process.pid)

    def stop(self) -> None:
        terminate(self.process, 15)
        self.log.close()


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def lone(url: str, count: int) -> dict[str, Any]:
    """``count`` requests one at a time, the first five left out (warming up)."""
    spans: dict[str, list[float]] = {"total": [], "submit": [], "to_end": [], "end_to_answer": []}
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(count):
            started = time.perf_counter()
            accepted = client.post("/v1/requests", json={"model": MODEL, "input": f"lone {i}"})
            submitted = time.perf_counter()
            accepted.raise_for_status()
            record = accepted.json()
            answer = client.get(f"/v1/requests/{record['id']}", params={"wait": 30}).json()
            answered, done = time.time(), time.perf_counter()
            if answer["status"] != "succeeded":
                raise RuntimeError(f"a lone request ended {answer['status']}")
            if i >= 5:
                spans["total"].append((done - started) * 1000)
                spans["submit"].append((submitted - started) * 1000)
                created, finished = _stamp(answer["created_at"]), _stamp(answer["finished_at"])
                spans["to_end"].append((finished - created) * 1000)
                spans["end_to_answer"].append((answered - finished) * 1000)
            time.sleep(0.3)
    return {name: round(statistics.median(values), 2) for name, values in spans.items()}


async def at_rate(service: Embedded, rate: float, seconds: float, seed: int) -> dict[str, Any]:
    """Open loop at ``rate``: each request submitted and long-polled to its end."""
    answered: dict[int, float] = {}

    async def long_poll(session: aiohttp.ClientSession, submitted: Submitted) -> None:
        async with session.get(
            f"/v1/requests/{submitted.request_id}", params={"wait": "30"}
        ) as got:
            if (await got.json()).get("status") == "succeeded":
                answered[submitted.index] = time.time()

    before = service.cpu_s()
    load = await open_loop(
        service.url,
        poisson_schedule(rate, seconds, seed),
        lambda i: {"model": MODEL, "input": f"embedded {rate:g} {i}", "timeout_s": 60},
        on_accepted=long_poll,
    )
    cpu_s = service.cpu_s() - before
    latencies = [answered[s.index] - s.sent_at for s in load.submitted if s.index in answered]
    return {
        "rate": rate,
        "sent": len(load.submitted) + load.errors,
        "answered": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 1),
        "cpu_ms_per_request": round(cpu_s * 1000 / max(len(latencies), 1), 2),
    }


def run_round(rates: list[float], seconds: float, lone_count: int, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-embedded-") as home:
        service = Embedded(Path(home))
        try:
            alone = lone(service.url, lone_count)
            steps = [
                asyncio.run(at_rate(service, rate, seconds, seed + i))
                for i, rate in enumerate(rates)
            ]
        finally:
            service.stop()
    return {"lone": alone, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="30,100,200")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lone", type=int, default=25, help="lone requests, five of them warm-up")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    runs = []
    for round_ in range(1, args.rounds + 1):
        run = {"round": round_, **run_round(rates, args.seconds, args.lone, 1000 * round_)}
        runs.append(run)
        if not args.json:
            print(round_, json.dumps(run), flush=True)
    if args.json:
        print(recorded_runs("bench_embedded.py", runs))


if __name__ == "__main__":
    main()
