"""What a submit costs before batchserve does anything: the HTTP server's and the web
framework's own CPU a request, and the load generator's, beside batchserve's whole submit.

    python scripts/bench_http_floor.py --json > docs/frontdoor-floor.json

Issue 19's goals 3 and 4 budget the whole durable submit (p99 ≤ 50 ms at 1,000/s) and all
roles (1.0 ms of CPU a request at 100/s) on two cores shared with the load generator. This
measures the floor under those budgets on the same machine, with the same open-loop load
generator (``batchserve.bench.loadgen``, aiohttp) and the same body, in one run:

- **asgi**: a bare ASGI callable under uvicorn (uvloop, httptools, no access log), as
  batchserve's API runs: it reads the body, parses it and answers 202 with a small JSON
  document. What the server alone costs. Both floors start as batchserve's roles do
  (``tune_gc``: start-up's objects frozen out of the collector).
- **fastapi**: a FastAPI app with one ``POST /v1/requests`` route that validates the body as
  batchserve's own ``SubmitRequest`` and answers the same 202. The framework and the
  validation, nothing durable.
- **batchserve**: ``batchserve bench --scenario ingest`` at the same rates (the API's CPU a
  submit: commit in Postgres, publish to RabbitMQ; the batcher and worker drain behind it,
  on the same cores).

``--servers uvicorn,granian --collectors off --no-batchserve`` measures the same two floors
under granian as well (a Rust HTTP server running the same ASGI apps on uvloop, one worker
process, its runtime as it ships), its CPU counted over its processes:
``docs/frontdoor-servers.json``.

The two floors are measured twice a round: with the load generator's garbage collector
running at Python's defaults while it sends, and as ``batchserve bench`` runs it (tuned by
``run_loop``, off while ``open_loop`` sends), to show what the generator's own collections
add to the latencies it measures. Each runs ``--step-s`` at each
rate, in turn, ``--rounds`` times. Needs the servers of
``bench --scenario ingest`` (``BATCHSERVE_DATABASE_URL``, ``_BROKER_URL``, ``_REDIS_URL``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import uvloop
from benchmarks_docs import recorded_runs
from fastapi import FastAPI, Response

from batchserve.api.schemas import SubmitRequest
from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.bench.stack import percentile
from batchserve.core.loops import tune_gc
from batchserve.testing.deployment import free_port

FLOORS = ("asgi", "fastapi")
COLLECTORS = ("running", "off")  # the load generator's, while it sends
SERVERS = ("uvicorn", "granian")
DEFAULT_GC = gc.get_threshold()
ANSWER = {"id": "0190f000-0000-7000-8000-000000000000", "object": "request", "state": "queued"}


async def _asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    orjson.loads(body)
    await send(
        {
            "type": "http.response.start",
            "status": 202,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": orjson.dumps(ANSWER)})


def _fastapi_app() -> Any:
    app = FastAPI()

    @app.post("/v1/requests", status_code=202)
    async def submit(body: SubmitRequest) -> Response:
        return Response(orjson.dumps(ANSWER), status_code=202, media_type="application/json")

    return app


def app_for(kind: str) -> Any:
    """The floor's app, started as batchserve's roles start (``tune_gc``); granian imports
    this as its factory (``--factory bench_http_floor:asgi_app`` and ``:fastapi_app``)."""
    app = _asgi_app if kind == "asgi" else _fastapi_app()
    tune_gc()
    return app


def asgi_app() -> Any:
    return app_for("asgi")


def fastapi_app() -> Any:
    return app_for("fastapi")


def serve(kind: str, port: int) -> None:
    import uvicorn

    app = app_for(kind)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )


def _body(seed: int) -> Any:
    return lambda i: {"model": "echo-100ms", "input": f"ingest {seed} {i}"}


def _tree_cpu_s(server: psutil.Process) -> float:
    """CPU seconds of ``server`` and its children (granian serves from a worker process)."""
    total = 0.0
    for process in [server, *server.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def _step(
    url: str, server: psutil.Process, rate: float, seconds: float, seed: int, collect: bool
) -> Any:
    def cpu() -> float:
        return _tree_cpu_s(server)

    before, loadgen_before = cpu(), time.process_time()
    schedule = poisson_schedule(rate, seconds, seed)
    load = await open_loop(url, schedule, _body(seed), collect=collect)
    server_s, loadgen_s = cpu() - before, time.process_time() - loadgen_before
    latencies = [s.latency_s * 1000.0 for s in load.submitted]
    answered = len(load.accepted)
    return {
        "rate": rate,
        "sent": len(load.submitted) + load.errors,
        "answered": answered,
        "errors": load.errors,
        "p50_ms": round(percentile(latencies, 0.5), 2),
        "p99_ms": round(percentile(latencies, 0.99), 2),
        "server_cpu_ms": round(server_s * 1000.0 / max(answered, 1), 3),
        "loadgen_cpu_ms": round(loadgen_s * 1000.0 / max(answered, 1), 3),
        "loadgen_gc": load.collector.as_dict(),
    }


def _collector(way: str) -> None:
    """The load generator's garbage collector: Python's defaults, or tuned as the bench's."""
    if way == "off":
        tune_gc()
    else:
        gc.unfreeze()
        gc.set_threshold(*DEFAULT_GC)


def _server_command(server: str, kind: str, port: int) -> list[str]:
    if server == "uvicorn":
        return [sys.executable, __file__, "--serve", kind, "--port", str(port)]
    return [
        *(sys.executable, "-m", "granian", "--interface", "asginl", "--loop", "uvloop"),
        *("--workers", "1", "--no-ws", "--log-level", "warning"),
        *("--host", "127.0.0.1", "--port", str(port), "--factory"),
        f"bench_http_floor:{kind}_app",
    ]


def run_floor(
    kind: str,
    collector: str,
    rates: list[float],
    seconds: float,
    seed: int,
    server_name: str = "uvicorn",
    warm_up_s: float = 1.0,
) -> list[dict[str, Any]]:
    port = free_port()
    here = Path(__file__).resolve().parent
    child = subprocess.Popen(
        _server_command(server_name, kind, port),
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)])},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:  # up when it accepts a connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"the {kind} server did not start") from None
                time.sleep(0.1)
        server = psutil.Process(child.pid)

        collect = collector == "running"

        async def steps() -> list[dict[str, Any]]:
            if warm_up_s > 0:  # not recorded
                await _step(url, server, 100.0, warm_up_s, seed - 1, collect)
            return [
                await _step(url, server, r, seconds, seed + i, collect) for i, r in enumerate(rates)
            ]

        _collector(collector)
        return uvloop.run(steps())
    finally:
        child.terminate()
        child.wait(timeout=30)


def run_batchserve(rates: list[float], seconds: float) -> list[dict[str, Any]]:
    command = [
        *(sys.executable, "-m", "batchserve.cli", "bench", "--scenario", "ingest"),
        *("--rates", ",".join(f"{r:g}" for r in rates), "--step-s", f"{seconds:g}", "--json"),
    ]
    doc = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return [
        {
            "rate": s["rate"],
            "sent": s["sent"],
            "answered": s["accepted"],
            "errors": s["errors"],
            "p50_ms": s["p50_ms"],
            "p99_ms": s["p99_ms"],
            "server_cpu_ms": s["cpu_ms_per_request"]["api"],
            "loadgen_cpu_ms": round(s["loadgen_cpu"] * 1000.0 / s["sent_rps"], 3),
            "loadgen_gc": s["loadgen_gc"],
            "roles_cpu_ms": round(sum(s["cpu_ms_per_request"].values()), 3),
        }
        for s in doc["steps"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,1000")
    parser.add_argument("--step-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", default="uvicorn", help="of " + ",".join(SERVERS))
    parser.add_argument("--collectors", default=",".join(COLLECTORS), help="of running,off")
    parser.add_argument("--no-batchserve", action="store_true", help="the floors alone")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", choices=FLOORS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    rates = [float(r) for r in args.rates.split(",")]
    servers, collectors = args.servers.split(","), args.collectors.split(",")
    if not set(servers) <= set(SERVERS) or not set(collectors) <= set(COLLECTORS):
        parser.error(f"--servers of {','.join(SERVERS)}, --collectors of {','.join(COLLECTORS)}")
    runs = []
    for round_ in range(1, args.rounds + 1):
        ways = [(s, k, c) for s in servers for k in FLOORS for c in collectors]
        if not args.no_batchserve:
            ways.append(("uvicorn", "batchserve", "off"))
        for server, kind, collector in ways:
            started = time.time()
            if kind == "batchserve":
                steps = run_batchserve(rates, args.step_s)
            else:
                seed = 1000 * round_
                steps = run_floor(kind, collector, rates, args.step_s, seed, server)
            runs.append(
                {
                    "round": round_,
                    "server": server,
                    "kind": kind,
                    "loadgen_gc": collector,
                    "started": started,
                    "steps": steps,
                }
            )
            if not args.json:
                for s in steps:
                    print(round_, server, kind, collector, s, flush=True)
    if args.json:
        print(recorded_runs("bench_http_floor.py", runs))


if __name__ == "__main__":
    main()
