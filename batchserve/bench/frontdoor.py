"""``bench --scenario frontdoor``: batchserve's HTTP paths against an in-process batcher.

Three ways to get an answer from the same fixed 100 ms model (W slots, batches of up to B), one
after another at each offered rate, open-loop Poisson traffic, each caller checking the answer
is its own:

- baseline: ``POST /v1/requests`` to FastAPI with an in-process asyncio batcher, nothing
  durable (``batchserve/bench/baseline.py``); the answer comes in the reply;
- longpoll: batchserve's ``POST /v1/requests`` (202 once committed), then
  ``GET /v1/requests/{id}?wait=30`` until it is terminal;
- sync: batchserve's ``POST /v1/chat/completions``, the answer in the reply.

Per path and rate: p50/p99 latency from send to answer, served/s (answers over the span from
the first send to the last answer), CPU milliseconds a request of each process (batchserve's
roles; the baseline's one process), and for batchserve's paths the difference to the baseline at
the same rate, judged against the front-door goals (+10 ms p50, +30 ms p99 at 30 and 100/s).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httpx
import orjson

from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.bench.stack import (
    BATCH_TIME_MS,
    BenchDeployment,
    Variant,
    _cpu_s,
    cpu_per,
    percentile,
    server_cpu_per,
    server_cpu_s,
    summary_ms,
    tcp_counters,
    tcp_delta,
)
from batchserve.testing.deployment import free_port, settled, terminate

PATHS = ("baseline", "longpoll", "sync")
GOAL_RATES = (30.0, 100.0)
GOAL_P50_MS = 10.0
GOAL_P99_MS = 30.0
TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@dataclass(frozen=True, slots=True)
class FrontDoorPlan:
    variant: Variant
    workers: int
    rates: list[float]
    duration_s: float
    seed: int


class Served(Protocol):
    """What a round drives: batchserve's API at ``url`` and the CPU of what serves it."""

    @property
    def url(self) -> str: ...

    @property
    def headers(self) -> dict[str, str]: ...

    def cpu_s(self) -> dict[str, float]: ...


class Baseline:
    """The in-process batcher as its own process, started and stopped by pid."""

    def __init__(self, log_dir: Path, variant: Variant, workers: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._argv = [
            sys.executable,
            *("-m", "batchserve.bench.baseline", "--port", str(self.port)),
            *("--batch", str(variant.max_batch_size), "--batch-ms", f"{BATCH_TIME_MS:g}"),
            *("--slots", str(workers)),
        ]
        self._log = log_dir / "baseline.log"
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        log = open(self._log, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(self._argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        give_up = time.monotonic() + 30.0
        async with httpx.AsyncClient() as client:
            while time.monotonic() < give_up:
                try:
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"the baseline did not come up; see {self._log}")

    def cpu_s(self) -> dict[str, float]:
        return {"baseline": _cpu_s(self.process.pid) if self.process else 0.0}

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, 10)


# Of the requests a round created, those in a batch dispatched before the batcher held them.
_JOINED = (
    "SELECT count(*) FILTER (WHERE r.created_at + r.queued_ms * interval '1 millisecond'"
    " > b.dispatched_at), count(*) FROM requests r JOIN batches b ON b.id = r.batch_id"
    " WHERE r.created_at >= to_timestamp(%s) AND r.created_at < to_timestamp(%s)"
)

# With one slot: how long it stood idle between a model's end and the next one's start, for
# each batch that was already waiting for it (its lease taken before the other model ended).
_SLOT_IDLE = (
    "WITH b AS (SELECT started_at, finished_at - model_ms * interval '1 millisecond' AS began,"
    " lag(finished_at) OVER (ORDER BY finished_at) AS before FROM batches"
    " WHERE outcome = 'succeeded' AND dispatched_at >= to_timestamp(%s)"
    " AND dispatched_at < to_timestamp(%s))"
    " SELECT extract(epoch FROM began - before) FROM b WHERE started_at < before"
)

# One slot: the requests that came before the batch ahead of theirs started its model, with
# room in it, and still waited for the next one (the in-process baseline puts each in the
# batch that starts after it comes); and by how long, p50, each came before that start. Both
# clocks are the deployment's (``batchserve/core/clock.py``). Each one waits a whole batch
# more than it would have in the baseline.
_MISSED = (
    "WITH b AS (SELECT id, finished_at - model_ms * interval '1 millisecond' AS began"
    " FROM batches WHERE outcome = 'succeeded' AND dispatched_at >= to_timestamp(%(start)s)"
    " AND dispatched_at < to_timestamp(%(end)s)),"
    " sized AS (SELECT b.id, b.began, (SELECT count(*) FROM requests m WHERE m.batch_id = b.id)"
    " AS size FROM b),"
    " o AS (SELECT id, lag(began) OVER (ORDER BY began) AS ahead,"
    " lag(size) OVER (ORDER BY began) AS ahead_size FROM sized),"
    " r AS (SELECT r.created_at, o.ahead, o.ahead_size FROM requests r JOIN o ON o.id = r.batch_id"
    " WHERE r.created_at >= to_timestamp(%(start)s) AND r.created_at < to_timestamp(%(end)s))"
    " SELECT count(*) FILTER (WHERE created_at < ahead AND ahead_size < %(room)s), count(*),"
    " percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ahead - created_at))"
    " FILTER (WHERE created_at < ahead AND ahead_size < %(room)s) FROM r"
)


async def run_frontdoor(deployment: BenchDeployment, plan: FrontDoorPlan) -> dict[str, Any]:
    baseline = Baseline(deployment.log_dir, plan.variant, plan.workers)
    try:
        await baseline.start()
        await deployment.start_variant(plan.variant)
        rows = await run_paths(deployment, baseline, plan, deployment)
    finally:
        await settled(deployment.stack, baseline.stop)
        await deployment.stop_variant(plan.variant)
    ideal = plan.variant.ideal_rps(plan.workers)
    return {
        "scenario": "frontdoor",
        "workers": plan.workers,
        "max_batch_size": plan.variant.max_batch_size,
        "batch_ms": BATCH_TIME_MS,
        "ideal_rps": ideal,
        "duration_s": plan.duration_s,
        "paths": list(PATHS),
        "results": rows,
        "goals": judge(rows, ideal),
    }


async def run_paths(
    served: Served, baseline: Baseline, plan: FrontDoorPlan, batches: BenchDeployment | None
) -> list[dict[str, Any]]:
    """Every path at each of the plan's rates, after a short warm-up of each (connections,
    caches, the batcher's rate meter). ``batches``: the deployment whose database the rounds
    read their batches' figures from (late joiners, a slot's idle time); ``None`` for none."""
    for path in PATHS:
        await _round(served, baseline, plan, path, 20.0, 1.0, batches)
    rows = []
    for rate in plan.rates:
        for path in PATHS:
            rows.append(await _round(served, baseline, plan, path, rate, plan.duration_s, batches))
    return rows


async def _round(
    served: Served,
    baseline: Baseline,
    plan: FrontDoorPlan,
    path: str,
    rate: float,
    duration_s: float,
    batches: BenchDeployment | None,
) -> dict[str, Any]:
    """One path at one offered rate: every answer checked against what was sent."""
    texts: dict[int, str] = {}
    answered: dict[int, tuple[float, str | None]] = {}  # index -> (answered at, its text)

    def body(index: int) -> dict[str, Any]:
        text = texts[index] = f"frontdoor {path} {rate:g} {index}"
        if path == "baseline":
            return {"input": text}
        if path == "sync":
            return {"model": plan.variant.name, "messages": [{"role": "user", "content": text}]}
        return {"model": plan.variant.name, "input": text, "timeout_s": 60}

    async def long_poll(session: aiohttp.ClientSession, submitted: Submitted) -> None:
        give_up = time.monotonic() + 90.0
        while time.monotonic() < give_up:
            url = f"/v1/requests/{submitted.request_id}"
            async with session.get(url, params={"wait": "30"}) as got:
                result = orjson.loads(await got.read())
            if result.get("status") in TERMINAL:
                output = result.get("output") or {}
                answered[submitted.index] = (time.time(), output.get("text"))
                return

    url = baseline.url if path == "baseline" else served.url
    cpu = baseline.cpu_s if path == "baseline" else served.cpu_s
    started = time.time()
    before, servers_before, tcp_before = cpu(), server_cpu_s(), tcp_counters()
    load = await open_loop(
        url,
        poisson_schedule(rate, duration_s, plan.seed),
        body,
        path="/v1/chat/completions" if path == "sync" else "/v1/requests",
        headers=None if path == "baseline" else served.headers,
        on_accepted=long_poll if path == "longpoll" else None,
    )
    after, servers_after, tcp_after = cpu(), server_cpu_s(), tcp_counters()
    joined, slot_idle, missed = None, None, None
    if path != "baseline" and batches is not None:
        found = await asyncio.to_thread(batches.query, _JOINED, (started, time.time()))
        joined = {"late": int(found[0][0]), "of": int(found[0][1])}
        if plan.workers == 1:
            found = await asyncio.to_thread(batches.query, _SLOT_IDLE, (started, time.time()))
            gaps = [float(g[0]) for g in found]
            slot_idle = {**summary_ms(gaps), "batches": len(gaps)} if gaps else None
            missed = await asyncio.to_thread(
                missed_batches, batches, started, time.time(), plan.variant.max_batch_size
            )
    latencies: list[float] = []
    finished: list[float] = []
    answered_at: dict[str, float] = {}  # batchserve's: request id -> when its answer came
    baseline_after: list[float] = []  # the baseline's: from its batch's model end to the answer
    wrong = 0
    for s in load.submitted:
        if path == "longpoll":
            if s.index not in answered:
                continue
            at, text = answered[s.index]
            latency = at - s.sent_at
        elif s.status == 200 and s.body is not None:
            text = _text(path, s.body)
            latency = s.latency_s
        else:
            continue
        if text != texts[s.index]:
            wrong += 1
            continue
        latencies.append(latency)
        finished.append(s.sent_at + latency)
        if path == "baseline":
            assert s.body is not None
            baseline_after.append(s.sent_at + latency - s.body["model_ended_at"])
        else:
            answered_at[_request_id(path, s)] = s.sent_at + latency
    after_model: dict[str, Any] | None = None
    if path == "baseline":
        after_model = {**summary_ms(baseline_after), "of": len(baseline_after)}
    elif batches is not None:
        after_model = await asyncio.to_thread(answered_after_model, batches, answered_at)
    sent = len(load.submitted) + load.errors
    first = min((s.sent_at for s in load.submitted), default=0.0)
    span = max(finished, default=first) - first
    return {
        "path": path,
        "offered_rps": rate,
        "sent": sent,
        "answered": len(latencies),
        "wrong": wrong,
        "refused": sum(1 for s in load.submitted if s.status not in (200, 202)),
        "errors": load.errors,
        "p50_ms": round(percentile(latencies, 0.50) * 1000.0, 1),
        "p99_ms": round(percentile(latencies, 0.99) * 1000.0, 1),
        "served_rps": round(len(latencies) / span, 1) if span > 0 else 0.0,
        "cpu_ms_per_request": cpu_per(before, after, len(latencies)),
        # Postgres, RabbitMQ and Redis beside the roles (the baseline uses none of them).
        "server_cpu_ms_per_request": server_cpu_per(servers_before, servers_after, len(latencies)),
        # Whether callers queued in the kernel before the service accepted them.
        "tcp": tcp_delta(tcp_before, tcp_after),
        # The load generator's own collections: every answer meanwhile was timed late.
        "loadgen_gc": load.collector.as_dict(),
        # Requests that rode in a batch sent before the batcher held them (late joiners).
        "joined": joined,
        # One slot: idle between back-to-back batches (model end to the next one's start).
        "slot_idle_ms": slot_idle,
        # One slot: requests that waited a batch more than the baseline would have (_MISSED).
        "missed": missed,
        # From each request's model end to its caller's answer: the part of the latency after
        # the batch (results stored and announced, the answer sent); the rest came before it.
        "after_model_ms": after_model,
    }


# Each request's batch: when its model ended (the deployment's clock, which on one host is the
# bench's own), so a round can say how long after it each caller had its answer.
_MODEL_ENDS = (
    "SELECT r.id::text, extract(epoch FROM b.finished_at) FROM requests r"
    " JOIN batches b ON b.id = r.batch_id WHERE r.id = ANY(%s::uuid[])"
    " AND b.outcome = 'succeeded'"
)


def answered_after_model(
    batches: BenchDeployment, answered_at: dict[str, float]
) -> dict[str, Any] | None:
    """From each request's model end to its caller's answer (``answered_at``: request id to
    when its answer came), over the requests found in a batch that succeeded."""
    ends = batches.query(_MODEL_ENDS, (list(answered_at),)) if answered_at else []
    after = [answered_at[found] - float(end) for found, end in ends]
    return {**summary_ms(after), "of": len(after)} if after else None


def missed_batches(batches: BenchDeployment, start: float, end: float, room: int) -> dict[str, Any]:
    """:data:`_MISSED` over the requests that came between ``start`` and ``end``."""
    [(count, of, by_s)] = batches.query(_MISSED, {"start": start, "end": end, "room": room})
    return {
        "count": int(count),
        "of": int(of),
        "by_ms_p50": None if by_s is None else round(float(by_s) * 1000.0, 2),
    }


def _request_id(path: str, submitted: Submitted) -> str:
    """A batchserve request's id: the submit's, or the one the OpenAI answer names."""
    if path == "longpoll":
        assert submitted.request_id is not None
        return submitted.request_id
    assert submitted.body is not None
    return str(uuid.UUID(hex=str(submitted.body["id"]).rpartition("-")[2]))


def _text(path: str, body: dict[str, Any]) -> str | None:
    if path == "baseline":
        return body.get("output")
    choices = body.get("choices") or [{}]
    return (choices[0].get("message") or {}).get("content")


def judge(rows: list[dict[str, Any]], ideal_rps: float) -> dict[str, Any]:
    """Each batchserve path against the baseline at the same rate: the latency goals where
    the rate is one of :data:`GOAL_RATES`, and the best served/s against the ideal."""
    base = {r["offered_rps"]: r for r in rows if r["path"] == "baseline"}
    latency = []
    for row in rows:
        floor = base.get(row["offered_rps"])
        if row["path"] == "baseline" or floor is None:
            continue
        p50 = round(row["p50_ms"] - floor["p50_ms"], 1)
        p99 = round(row["p99_ms"] - floor["p99_ms"], 1)
        judged = row["offered_rps"] in GOAL_RATES
        latency.append(
            {
                "path": row["path"],
                "offered_rps": row["offered_rps"],
                "p50_over_baseline_ms": p50,
                "p99_over_baseline_ms": p99,
                "met": (p50 <= GOAL_P50_MS and p99 <= GOAL_P99_MS) if judged else None,
            }
        )
    best = {p: max((r["served_rps"] for r in rows if r["path"] == p), default=0.0) for p in PATHS}
    throughput = {p: round(served / ideal_rps, 3) for p, served in best.items()}
    return {"latency": latency, "served_vs_ideal": throughput}
