"""The operator's queries, on real Postgres and on the embedded SQLite file, and the metrics the
store counts as it commits (the same in every process)."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from batchserve.core.domain import BatchOutcome
from batchserve.core.store import BatchStart, JobStore
from batchserve.core.store.stats import StatsReader
from tests.integration.test_store import claim, command, ok, store, submit

__all__ = ["store"]  # the fixture, parametrized over both databases


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


async def test_depths_running_batches_finished_and_failures(store: JobStore) -> None:
    stats = StatsReader(store.engine)
    now = time.time()
    queued = await submit(store, *(command(f"q{i}") for i in range(3)))
    done = await submit(store, command("d1"), command("d2"))
    batch_id = await claim(store, done)
    start = await store.start_batch(batch_id, "w1", now, 2.0)
    assert isinstance(start, BatchStart)
    running = await submit(store, command("r"))
    running_batch = await claim(store, running)
    await store.start_batch(running_batch, "w1", now, 2.0)
    expiring = await submit(store, command("late", timeout_s=0.01))
    expirations_before = counter("batchserve_expirations_total")
    await store.complete_batch(
        batch_id,
        attempt=1,
        outcomes=[ok(i) for i in done],
        now=time.time(),
        model_ms=100.0,
    )
    assert await store.expire_overdue(time.time() + 1) == expiring

    (depth,) = await stats.queue_depths()
    assert (depth.model, depth.lane, depth.depth) == ("echo-100ms", "interactive", len(queued))
    assert now - 10 < depth.oldest_created_at <= time.time()
    assert await stats.running_batches() == {"echo-100ms": 1}
    assert await stats.arrivals(now - 60) == {"echo-100ms": 7}
    assert await stats.arrivals(time.time() + 60) == {}
    finished = await stats.finished_requests(now - 60)
    assert sorted(f.state for f in finished) == ["expired", "succeeded", "succeeded"]
    assert all(f.total_ms == 102.0 for f in finished if f.state == "succeeded")  # TIMINGS
    batches = await stats.recent_batches(now - 60)
    assert sorted(b.size for b in batches) == [1, 2]
    assert {b.model_ms for b in batches} == {None, 100.0}
    (failure,) = await stats.recent_failures(now - 60)
    assert (failure.kind, failure.id, failure.state) == ("request", expiring[0], "expired")
    assert failure.code == "deadline_exceeded"
    assert counter("batchserve_expirations_total") == expirations_before + 1


async def test_the_store_counts_retries_and_poison_isolations_after_commit(
    store: JobStore,
) -> None:
    retries = counter("batchserve_retries_total", model="echo-100ms")
    poison = counter("batchserve_poison_isolations_total")
    ids = await submit(store, command("a"), command("b"), command("c"), command("d"))
    batch_id = await claim(store, ids)
    await store.start_batch(batch_id, "w1", time.time() - 10, 1.0)
    reaped = await store.reap_batch(batch_id, now=time.time(), outcome=BatchOutcome.CRASHED)
    assert len(reaped.requeued) == 4 and reaped.charged == ()
    assert counter("batchserve_retries_total", model="echo-100ms") == retries + 4
    # A culprit alone: charged a failure, counted as a poison isolation.
    (lone,) = await submit(store, command("culprit"))
    lone_batch = await claim(store, [lone])
    started = await store.start_batch(lone_batch, "w1", time.time(), 2.0)
    assert isinstance(started, BatchStart)
    charged = await store.complete_batch(
        lone_batch,
        attempt=1,
        outcomes=[],
        failed_alone=[(lone, "boom")],
        now=time.time(),
        model_ms=1.0,
    )
    assert charged is not None and charged.charged == (lone,)
    assert counter("batchserve_poison_isolations_total") == poison + 1
    assert counter("batchserve_retries_total", model="echo-100ms") == retries + 5  # it goes back
