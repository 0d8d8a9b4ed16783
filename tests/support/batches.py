"""A batch run through the store as the batcher and a worker would, for tests that need
requests to end with results and no worker running."""

from __future__ import annotations

import time

from batchserve.core.domain import ItemResult, Timings
from batchserve.core.ids import uuid7
from batchserve.core.store import BatchStart, ItemOutcome, JobStore

TIMINGS = Timings(1.0, 1.0, 1.0, 3.0)


async def complete(
    store: JobStore, ids: list[str], now: float | None = None, *, output: str = "out"
) -> None:
    """Claim ``ids`` as one batch, start it and write ``output`` as each one's result."""
    now = time.time() if now is None else now
    batch_id = uuid7()
    claimed = await store.claim_batch(
        batch_id=batch_id,
        model="echo-100ms",
        request_ids=ids,
        now=now,
        estimated_s=0.1,
        lease_until=now + 5,
    )
    assert len(claimed) == len(ids)
    start = await store.start_batch(batch_id, "w", now, 5.0)
    assert isinstance(start, BatchStart)
    outcomes = [
        ItemOutcome(ItemResult(request_id=i, output=output, finish_reason="stop"), TIMINGS)
        for i in ids
    ]
    await store.complete_batch(
        batch_id, attempt=start.attempt, outcomes=outcomes, now=now, model_ms=1.0
    )
