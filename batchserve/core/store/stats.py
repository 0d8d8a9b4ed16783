"""Read-only figures for operators: queue depths, running batches, recent results and failures.

Every query is bounded: "recent" means requests and batches created in the last minutes, found
through the primary key (UUIDv7 ids sort by creation), so a dashboard polling every few seconds
costs a few index range scans however large the tables grow.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from batchserve.core.db import transaction
from batchserve.core.domain import BatchOutcome, RequestState, from_epoch
from batchserve.core.ids import uuid7_floor
from batchserve.core.store.base import batches_t, epoch, requests_t

S = RequestState

# A request finished in the window was created at most this long before the window began.
LOOKBACK_S = 900.0


@dataclass(frozen=True, slots=True)
class QueueDepth:
    model: str
    lane: str
    depth: int
    oldest_created_at: float


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    model: str
    state: str
    finished_at: float
    total_ms: float | None


@dataclass(frozen=True, slots=True)
class RecentBatch:
    model: str
    size: int
    dispatched_at: float
    model_ms: float | None
    outcome: str | None


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # "request" or "batch"
    id: str
    model: str
    state: str
    code: str | None
    message: str | None
    at: float


class StatsReader:
    """Operator figures from the store's tables (Postgres or SQLite); never writes."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def queue_depths(self) -> list[QueueDepth]:
        """Requests waiting for a batch (``queued``), per model and lane, with the oldest."""
        query = (
            select(
                requests_t.c.model,
                requests_t.c.lane,
                func.count(),
                func.min(requests_t.c.created_at),
            )
            .where(requests_t.c.state == S.QUEUED.value)
            .group_by(requests_t.c.model, requests_t.c.lane)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [QueueDepth(r[0], r[1], int(r[2]), epoch(r[3])) for r in rows]

    async def running_batches(self) -> dict[str, int]:
        """Batches a worker has started and not finished, per model: the busy slots."""
        query = (
            select(batches_t.c.model, func.count())
            .where(batches_t.c.outcome.is_(None), batches_t.c.started_at.is_not(None))
            .group_by(batches_t.c.model)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return {r[0]: int(r[1]) for r in rows}

    async def arrivals(self, since: float) -> dict[str, int]:
        """Requests accepted since ``since``, per model."""
        query = (
            select(requests_t.c.model, func.count())
            .where(requests_t.c.id >= uuid7_floor(since))
            .group_by(requests_t.c.model)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return {r[0]: int(r[1]) for r in rows}

    async def finished_requests(self, since: float, limit: int = 50_000) -> list[FinishedRequest]:
        """Requests that reached a terminal state since ``since`` (newest first, at most
        ``limit``)."""
        query = (
            select(
                requests_t.c.model,
                requests_t.c.state,
                requests_t.c.finished_at,
                requests_t.c.total_ms,
            )
            .where(
                requests_t.c.id >= uuid7_floor(since - LOOKBACK_S),
                requests_t.c.finished_at >= from_epoch(since),
            )
            .order_by(requests_t.c.id.desc())
            .limit(limit)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [FinishedRequest(r[0], r[1], epoch(r[2]), r[3]) for r in rows]

    async def recent_batches(self, since: float, limit: int = 20_000) -> list[RecentBatch]:
        """Batches dispatched since ``since``."""
        query = (
            select(
                batches_t.c.model,
                batches_t.c.size,
                batches_t.c.dispatched_at,
                batches_t.c.model_ms,
                batches_t.c.outcome,
            )
            .where(batches_t.c.id >= uuid7_floor(since))
            .order_by(batches_t.c.id.desc())
            .limit(limit)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [RecentBatch(r[0], int(r[1]), epoch(r[2]), r[3], r[4]) for r in rows]

    async def recent_failures(self, since: float, limit: int = 20) -> list[Failure]:
        """The latest failed or expired requests and crashed or abandoned batches."""
        requests_query = (
            select(
                requests_t.c.id,
                requests_t.c.model,
                requests_t.c.state,
                requests_t.c.error_code,
                requests_t.c.error_message,
                requests_t.c.finished_at,
            )
            .where(
                requests_t.c.id >= uuid7_floor(since - LOOKBACK_S),
                requests_t.c.state.in_([S.FAILED.value, S.EXPIRED.value]),
                requests_t.c.finished_at >= from_epoch(since),
            )
            .order_by(requests_t.c.finished_at.desc())
            .limit(limit)
        )
        batches_query = (
            select(
                batches_t.c.id,
                batches_t.c.model,
                batches_t.c.outcome,
                batches_t.c.worker,
                batches_t.c.finished_at,
            )
            .where(
                and_(
                    batches_t.c.id >= uuid7_floor(since - LOOKBACK_S),
                    batches_t.c.outcome.in_(
                        [BatchOutcome.CRASHED.value, BatchOutcome.ABANDONED.value]
                    ),
                    batches_t.c.finished_at >= from_epoch(since),
                )
            )
            .order_by(batches_t.c.finished_at.desc())
            .limit(limit)
        )
        async with transaction(self.engine) as conn:
            request_rows = (await conn.execute(requests_query)).all()
            batch_rows = (await conn.execute(batches_query)).all()
        failures = [
            Failure("request", str(r[0]), r[1], r[2], r[3], (r[4] or "")[:300], epoch(r[5]))
            for r in request_rows
        ]
        failures += [
            Failure("batch", str(r[0]), r[1], r[2], None, _batch_detail(r[2], r[3]), epoch(r[4]))
            for r in batch_rows
        ]
        failures.sort(key=lambda f: f.at, reverse=True)
        return failures[:limit]


def _batch_detail(outcome: str, worker: str | None) -> str:
    if outcome == BatchOutcome.ABANDONED.value:
        return "dispatched but not started in time; its requests were requeued"
    return f"worker {worker or '?'} died or stalled running it; its requests were requeued"
