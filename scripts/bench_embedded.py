"""The embedded mode (``batchserve serve`` with no servers configured) against the front
door's in-process batcher: where a lone request's time goes, and the front door's paths and
goals.

    python scripts/bench_embedded.py --json > docs/frontdoor-embedded-goals.json

The embedded mode is every role in one process on a SQLite file: an in-process batcher that
is durable, the thing issue 19 measures the full stack against. This starts it on a fresh
home directory with the seeds' model (every batch 100 ms, up to 32 requests, one slot), and
beside it the front door's baseline (``batchserve/bench/baseline.py``: FastAPI and an
in-process asyncio batcher, nothing durable), then:

- **lone requests**, one at a time, 0.3 s apart: each submitted (``POST /v1/requests``, its
  202 once committed) and long-polled to its end; from the client's clock and the request's
  own ``created_at`` and ``finished_at``: the submit's round trip, acceptance to the end of
  its batch (the model's 100 ms and the batcher's and the store's steps around it), and that
  end to the caller holding the answer;
- **the front door's paths** (``bench --scenario frontdoor``'s rounds, open-loop Poisson, each
  answer checked to be the caller's own): the baseline, submit + long-poll and the synchronous
  ``/v1/chat/completions`` at each rate, in turn; latency from send to answer, served/s, the
  process's CPU a request, and the goals judged (+10 ms p50, +30 ms p99 over the baseline at
  30 and 100/s);
- with ``--job-lines N``, **a batch job of N lines** (OpenAI's batch API) and lone requests one
  at a time beside it until it ends: the job's time and the callers' waits meanwhile.

Each round starts both afresh. Needs nothing but this checkout's environment;
``--service-path DIR`` runs the service from another checkout (an A/B), measured by this one.
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

import httpx
from benchmarks_docs import recorded_runs

from batchserve.bench.frontdoor import Baseline, FrontDoorPlan, judge, run_paths
from batchserve.bench.stack import Variant, _cpu_s
from batchserve.testing.deployment import free_port, terminate

# The seeds' model, as the front door's scenario runs it: one slot of batches of up to 32.
VARIANT = Variant("echo-100ms", "adaptive", 32)
MODEL = VARIANT.name
# Settings that would point the service at servers: unset, so it runs embedded.
SERVER_SETTINGS = ("BATCHSERVE_DATABASE_URL", "BATCHSERVE_BROKER_URL", "BATCHSERVE_REDIS_URL")


class Embedded:
    """``batchserve serve`` on a fresh home directory, no servers, auth off."""

    def __init__(self, home: Path, pythonpath: str | None = None) -> None:
        registry = home / "models.toml"
        registry.write_text(VARIANT.toml())
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers: dict[str, str] = {}  # auth off
        env = {k: v for k, v in os.environ.items() if k not in SERVER_SETTINGS}
        env.update(
            BATCHSERVE_HOME=str(home / "home"),
            BATCHSERVE_MODELS=str(registry),
            BATCHSERVE_AUTH="disabled",
        )
        if pythonpath:  # the service from another checkout (an A/B), measured by this one
            env["PYTHONPATH"] = pythonpath
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
                self.stop()
                raise RuntimeError(f"the embedded service did not start: {home / 'serve.log'}")
            time.sleep(0.2)

    def cpu_s(self) -> dict[str, float]:
        return {"embedded": _cpu_s(self.process.pid)}

    def stop(self) -> None:
        terminate(self.process, 15)
        self.log.close()


def _stamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def lone_request(client: httpx.Client, text: str) -> dict[str, float]:
    """One request submitted and long-polled to its end: its spans, in ms."""
    started = time.perf_counter()
    accepted = client.post("/v1/requests", json={"model": MODEL, "input": text})
    submitted = time.perf_counter()
    accepted.raise_for_status()
    record = accepted.json()
    answer = client.get(f"/v1/requests/{record['id']}", params={"wait": 30}).json()
    answered, done = time.time(), time.perf_counter()
    if answer["status"] != "succeeded":
        raise RuntimeError(f"a lone request ended {answer['status']}")
    created, finished = _stamp(answer["created_at"]), _stamp(answer["finished_at"])
    return {
        "total": (done - started) * 1000,
        "submit": (submitted - started) * 1000,
        "to_end": (finished - created) * 1000,
        "end_to_answer": (answered - finished) * 1000,
    }


def lone(url: str, count: int) -> dict[str, Any]:
    """``count`` requests one at a time, the first five left out (warming up)."""
    measured = []
    with httpx.Client(base_url=url, timeout=60) as client:
        for i in range(count):
            spans = lone_request(client, f"lone {i}")
            if i >= 5:
                measured.append(spans)
            time.sleep(0.3)
    return {name: round(statistics.median(s[name] for s in measured), 2) for name in measured[0]}


def job_beside(url: str, lines: int) -> dict[str, Any]:
    """A batch job of ``lines`` chat requests (OpenAI's batch API: a file, then the job), and
    lone requests one at a time, 0.2 s apart, from its creation to its end: how long it took,
    and what the callers beside it waited meanwhile (SQLite's work for the job's rows and the
    callers' shares the one event loop)."""
    body = "\n".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"job {i}"}]},
            }
        )
        for i in range(lines)
    )
    waits: list[float] = []
    with httpx.Client(base_url=url, timeout=60) as client:
        upload = client.post(
            "/v1/files", files={"file": ("lines.jsonl", body.encode())}, data={"purpose": "batch"}
        )
        upload.raise_for_status()
        started = time.perf_counter()
        created = client.post(
            "/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        while True:
            waits.append(lone_request(client, f"beside {len(waits)}")["total"])
            job = client.get(f"/v1/batches/{created.json()['id']}").json()
            if job["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(0.2)
    return {
        "lines": lines,
        "job_s": round(time.perf_counter() - started, 1),
        "status": job["status"],
        "request_counts": job["request_counts"],
        "lone_requests": len(waits),
        "lone_p50_ms": round(statistics.median(waits), 1),
        "lone_max_ms": round(max(waits), 1),
    }


async def front_door(
    service: Embedded, baseline: Baseline, rates: list[float], seconds: float, seed: int
) -> list[dict[str, Any]]:
    await baseline.start()
    plan = FrontDoorPlan(VARIANT, workers=1, rates=rates, duration_s=seconds, seed=seed)
    return await run_paths(service, baseline, plan, batches=None)


def run_round(
    rates: list[float],
    seconds: float,
    lone_count: int,
    seed: int,
    job_lines: int = 0,
    service_path: str | None = None,
) -> dict[str, Any]:
    """Lone requests, then the front door's paths at ``rates`` (none: skipped), then a job of
    ``job_lines`` (0: none), on a fresh service."""
    run: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-embedded-") as home:
        service = Embedded(Path(home), service_path)
        baseline = Baseline(Path(home), VARIANT, workers=1)
        try:
            run["lone"] = lone(service.url, lone_count)
            if rates:
                results = asyncio.run(front_door(service, baseline, rates, seconds, seed))
                run["results"] = results
                run["goals"] = judge(results, VARIANT.ideal_rps(1))
            if job_lines:
                run["job"] = job_beside(service.url, job_lines)
        finally:
            baseline.stop()
            service.stop()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="30,100,200,300", help="'' for none")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lone", type=int, default=25, help="lone requests, five of them warm-up")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--job-lines", type=int, default=0, help="a batch job of this many lines")
    parser.add_argument("--service-path", help="PYTHONPATH of the service (another checkout)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",") if r]
    runs = []
    for round_ in range(1, args.rounds + 1):
        measured = run_round(
            rates, args.seconds, args.lone, 1000 * round_, args.job_lines, args.service_path
        )
        run = {"round": round_, **measured}
        runs.append(run)
        if not args.json:
            print(round_, json.dumps(run), flush=True)
    if args.json:
        print(recorded_runs("bench_embedded.py", runs))


if __name__ == "__main__":
    main()
