"""``bench --scenario overhead``: live latency against a zero-overhead service on the same trace.

Poisson traffic at a fraction of the adaptive variant's ideal capacity (30 % by default); each
request is long-polled to its result. The arrival trace is what the API recorded (each
request's ``created_at``), replayed through the simulator with the variant's policy config, so
the difference per request is what the live system adds to the policy's own waiting. Each
request's latency, from the load generator's send to the long-poll's answer, is cut into:

| stage | from | to |
|---|---|---|
| api | sent by the client | the API's handler starts (``created_at``) |
| to_batcher | ``created_at`` | the batcher holds it (commit, publish, delivery: ``queued_ms``) |
| batch_wait | the batcher holds it | its batch is dispatched (the policy: ``batch_wait_ms``) |
| dispatch | dispatched | the model starts (claim, Celery hand-over, lease) |
| model | model start | model end (``model_ms``) |
| write_notify | model end | the terminal change is announced (results committed, published) |
| poll | announced | the client has the answer (the API wakes, reads, responds) |
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from batchserve.batching.batcher import estimator_for, policy_config
from batchserve.batching.simulator import Arrival, simulate
from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.bench.stack import BenchDeployment, Variant, cpu_per, percentile, summary_ms

STAGES = ("api", "to_batcher", "batch_wait", "dispatch", "model", "write_notify", "poll")
TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@dataclass(frozen=True, slots=True)
class LatencyPlan:
    variants: list[Variant]
    workers: int
    reference_rps: float  # the adaptive variant's ideal: loads are fractions of it
    loads: list[float]
    duration_s: float
    timeout_s: float  # each request's deadline; a hopeless one is refused at admission
    seed: int


@dataclass(frozen=True, slots=True)
class _Live:
    id: str
    created: float
    queued_s: float
    batch_wait_s: float
    model_s: float
    total_s: float
    state: str
    batch_id: str | None


async def run_overhead(deployment: BenchDeployment, plan: LatencyPlan) -> dict[str, Any]:
    results = []
    for variant in plan.variants:
        await deployment.start_variant(variant)
        await _trace(deployment, plan, variant, rate=20.0, duration_s=1.0)  # warm-up
        for load in plan.loads:
            rate = load * plan.reference_rps
            result = await _trace(deployment, plan, variant, rate, plan.duration_s)
            results.append({"variant": variant.label, "load": load, **result})
        await deployment.stop_variant(variant)
    return {
        "scenario": "overhead",
        "workers": plan.workers,
        "reference_rps": plan.reference_rps,
        "duration_s": plan.duration_s,
        "stages": list(STAGES),
        "results": results,
    }


async def _trace(
    deployment: BenchDeployment, plan: LatencyPlan, variant: Variant, rate: float, duration_s: float
) -> dict[str, Any]:
    done: dict[str, float] = {}
    give_up_s = plan.timeout_s + 30.0

    async def poll(session: aiohttp.ClientSession, submitted: Submitted) -> None:
        request_id = submitted.request_id
        if request_id is None:
            return
        waited = 0.0
        while waited < give_up_s:
            async with session.get(f"/v1/requests/{request_id}", params={"wait": "30"}) as got:
                body = orjson.loads(await got.read())
            if body.get("status") in TERMINAL:
                done[request_id] = time.time()
                return
            waited += 30.0

    roles_before = deployment.cpu_s()
    load = await open_loop(
        deployment.url,
        poisson_schedule(rate, duration_s, plan.seed),
        lambda i: {"model": variant.name, "input": f"trace {i}", "timeout_s": plan.timeout_s},
        headers=deployment.headers,
        on_accepted=poll,
    )
    accepted = {s.request_id: s for s in load.accepted if s.request_id}
    cpu_ms = cpu_per(roles_before, deployment.cpu_s(), len(accepted))
    rows = _rows(deployment, list(accepted))
    return {
        "offered_rps": round(rate, 1),
        "sent": len(load.submitted) + load.errors,
        "accepted": len(accepted),
        "refused": len(load.submitted) - len(accepted),
        "errors": load.errors,
        "cpu_ms_per_request": cpu_ms,
        "submit": summary_ms([s.latency_s for s in load.submitted]),
        **_compare(deployment, variant, plan.workers, rows, accepted, done),
    }


def _rows(deployment: BenchDeployment, ids: list[str]) -> list[_Live]:
    rows = deployment.query(
        "SELECT id, extract(epoch FROM created_at), queued_ms, batch_wait_ms, model_ms, total_ms,"
        " state, batch_id FROM requests WHERE id = ANY(%s::uuid[])",
        (ids,),
    )
    return [
        _Live(
            id=str(r[0]),
            created=float(r[1]),
            queued_s=(r[2] or 0.0) / 1000.0,
            batch_wait_s=(r[3] or 0.0) / 1000.0,
            model_s=(r[4] or 0.0) / 1000.0,
            total_s=(r[5] or 0.0) / 1000.0,
            state=str(r[6]),
            batch_id=str(r[7]) if r[7] is not None else None,
        )
        for r in rows
    ]


def _compare(
    deployment: BenchDeployment,
    variant: Variant,
    workers: int,
    rows: list[_Live],
    accepted: dict[str, Submitted],
    done: dict[str, float],
) -> dict[str, Any]:
    """Live against simulated latency per request, and the live breakdown."""
    if not rows:
        return {"succeeded": 0}
    t0 = min(r.created for r in rows)
    spec = variant.spec()
    simulated = simulate(
        [Arrival(at=r.created - t0, id=r.id) for r in rows],
        workers=workers,
        config=policy_config(spec),
        estimator=estimator_for(spec),
    )
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    live_s, sim_s, overhead_s, sim_wait_s = [], [], [], []
    heard = deployment.clock.heard
    for row in rows:
        outcome = simulated.outcomes[row.id]
        if row.state != "succeeded" or row.id not in done or outcome.latency_s is None:
            continue
        sent = accepted[row.id].sent_at
        received = row.created + row.queued_s
        dispatched = received + row.batch_wait_s
        finished = row.created + row.total_s
        announced = heard.get(row.id, done[row.id])
        for name, span in zip(
            STAGES,
            (
                row.created - sent,
                row.queued_s,
                row.batch_wait_s,
                finished - row.model_s - dispatched,
                row.model_s,
                announced - finished,
                done[row.id] - announced,
            ),
            strict=True,
        ):
            stages[name].append(span)
        live = done[row.id] - sent
        live_s.append(live)
        sim_s.append(outcome.latency_s)
        overhead_s.append(live - outcome.latency_s)
        assert outcome.dispatched is not None
        sim_wait_s.append(outcome.dispatched - outcome.arrived)
    batch_sizes = _batch_sizes(deployment, {r.batch_id for r in rows if r.batch_id})
    return {
        "succeeded": len(live_s),
        "not_succeeded": len(rows) - len(live_s),
        **{f"live_{k}": v for k, v in _percentiles(live_s).items()},
        **{f"sim_{k}": v for k, v in _percentiles(sim_s).items()},
        "overhead_p50_ms": round(percentile(overhead_s, 0.5) * 1000.0, 2),
        "overhead_p99_ms": round(percentile(overhead_s, 0.99) * 1000.0, 2),
        "mean_batch": round(sum(batch_sizes) / len(batch_sizes), 2) if batch_sizes else 0.0,
        "sim_mean_batch": round(simulated.mean_batch, 2),
        "breakdown": {name: summary_ms(spans) for name, spans in stages.items()},
        "sim_batch_wait": summary_ms(sim_wait_s),
    }


def _percentiles(values_s: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(percentile(values_s, q / 100.0) * 1000.0, 2) for q in (50, 95, 99)}


def _batch_sizes(deployment: BenchDeployment, batch_ids: set[str]) -> list[int]:
    if not batch_ids:
        return []
    rows = deployment.query(
        "SELECT size FROM batches WHERE id = ANY(%s::uuid[])", (sorted(batch_ids),)
    )
    return [int(r[0]) for r in rows]
