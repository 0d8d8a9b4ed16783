"""Shared plumbing of the job store: the engine, change notifications, small helpers."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, case, insert, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batchserve.core.db import is_postgres
from batchserve.core.domain import (
    DeliveryStatus,
    ErrorCode,
    ItemResult,
    QueueMessage,
    RequestRecord,
    RequestState,
    StateChange,
    Timings,
    from_epoch,
)
from batchserve.core.ids import uuid7
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
from batchserve.core.records import aware
from batchserve.core.tables import batches_table, deliveries_table, events_table, requests_table

requests_t = requests_table
batches_t = batches_table
events_t = events_table
deliveries_t = deliveries_table

OnChange = Callable[[StateChange], Awaitable[None]]
S = RequestState
log = get_logger("batchserve.store")


@dataclass(frozen=True, slots=True)
class Admission:
    """The outcome of one submit: the stored request, and whether it was a replay."""

    record: RequestRecord
    replayed: bool
    message: QueueMessage | None  # to publish; None for a replay


@dataclass(frozen=True, slots=True)
class ClaimedRequest:
    id: str
    input: str | None
    messages: list[dict[str, Any]] | None
    params: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class BatchStart:
    """What a worker may run: the batch's attempt and the members still waiting for it."""

    attempt: int
    live_ids: frozenset[str]
    # Its members were requeued after a batch crashed the worker: one of them may crash it again.
    isolating: bool = False


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    result: ItemResult
    timings: Timings
    # When the model finished it, if not when it is written (an engine's sequence leaves at
    # its own step; the write follows).
    finished_at: float | None = None


@dataclass(frozen=True, slots=True)
class Reaped:
    """Requests a reap or retry put back in the queue, and those it ended."""

    requeued: tuple[QueueMessage, ...] = ()
    failed: tuple[str, ...] = ()
    expired: tuple[str, ...] = ()
    # Members that made the model fail alone and were charged a failure (poison suspects).
    charged: tuple[str, ...] = ()

    @property
    def ended(self) -> tuple[str, ...]:
        return self.failed + self.expired

    def merge(self, other: Reaped) -> Reaped:
        return Reaped(
            requeued=self.requeued + other.requeued,
            failed=self.failed + other.failed,
            expired=self.expired + other.expired,
            charged=self.charged + other.charged,
        )


@dataclass(frozen=True, slots=True)
class ExpiredLease:
    batch_id: uuid.UUID
    model: str
    started: bool


def advisory_key(tenant: str, key: str) -> int:
    digest = hashlib.blake2b(f"{tenant}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class StoreBase:
    """The engine and the change callback every verb shares."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_failures: int = 3,
        on_change: OnChange | None = None,
    ) -> None:
        self.engine = engine
        self.max_failures = max_failures
        self._on_change = on_change
        self._postgres = is_postgres(engine)

    def set_on_change(self, on_change: OnChange | None) -> None:
        self._on_change = on_change

    @staticmethod
    async def _log_terminal(
        conn: AsyncConnection,
        ids: Iterable[str],
        state: RequestState,
        now: float,
        batch_id: uuid.UUID | None = None,
        with_webhook: Collection[str] | None = None,
    ) -> None:
        """Append terminal transitions, in the transaction that makes them, and queue the
        webhook delivery of each request that asked for one (the outbox: no result is ever
        committed without its delivery, nor a delivery without its result).

        ``with_webhook``: the ids known to have a webhook URL, when the caller knows; the
        outbox insert is skipped when none has.
        """
        at = from_epoch(now)
        request_ids = [uuid.UUID(i) for i in ids]
        if not request_ids:
            return
        if conn.dialect.name == "postgresql":  # one statement of fixed text, prepared once
            await conn.execute(
                _LOG_EVENTS_PG,
                {"ids": request_ids, "state": state.value, "batch_id": batch_id, "at": at},
            )
        else:
            rows = [
                {"request_id": rid, "state": state.value, "batch_id": batch_id, "at": at}
                for rid in request_ids
            ]
            await conn.execute(insert(events_t), rows)
        if with_webhook is None:
            await conn.execute(outbox_insert(request_ids, state, at))
        elif with_webhook:
            await conn.execute(outbox_insert([uuid.UUID(i) for i in with_webhook], state, at))

    async def _emit(self, state: RequestState, ids: Iterable[str], **fields: Any) -> None:
        ids = tuple(ids)
        if not ids:
            return
        observe_state_change(state, ids, fields.get("batch_id"), fields.get("model"))
        if self._on_change is not None:
            await self._on_change(StateChange(request_ids=ids, state=state, **fields))


def observe_state_change(
    state: RequestState, ids: tuple[str, ...], batch_id: str | None, model: str | None
) -> None:
    """Count a committed change and log it with its request ids, so a request's history can
    be grepped by its id in the log of whichever process changed it."""
    if state.terminal:
        metrics().finished.labels(state.value).inc(len(ids))
        if state is S.EXPIRED:
            metrics().expirations.inc(len(ids))
        elif state is S.CANCELLED:
            metrics().cancellations.inc(len(ids))
    for at in range(0, len(ids), _IDS_PER_LINE):
        chunk = ids[at : at + _IDS_PER_LINE]
        log.info(
            f"requests_{state.value}",
            count=len(chunk),
            request_ids=list(chunk),
            batch_id=batch_id,
            model=model,
        )


# A bulk job's cancellation ends thousands at once: log lines stay a few kilobytes.
_IDS_PER_LINE = 100


_LOG_EVENTS_PG = text(
    "INSERT INTO request_events (request_id, state, batch_id, at) "
    "SELECT id, :state, :batch_id, :at FROM unnest(CAST(:ids AS uuid[])) AS id"
)


def new_delivery_id() -> str:
    """A webhook message id: ``msg_`` and a UUIDv7, so deliveries sort by creation."""
    return "msg_" + uuid7().hex


def outbox_insert(request_ids: list[uuid.UUID], state: RequestState, at: Any) -> Any:
    """``INSERT INTO webhook_deliveries ... SELECT ... FROM requests`` for those with a URL.

    One statement whatever the count; the ids are minted here and picked per row by a CASE,
    which Postgres and SQLite both run.
    """
    delivery_id = case({rid: new_delivery_id() for rid in request_ids}, value=requests_t.c.id)
    at_ts = literal(at, DateTime(timezone=True))
    rows = select(
        delivery_id,
        requests_t.c.id,
        requests_t.c.tenant,
        requests_t.c.webhook_url,
        literal(f"request.{state.value}"),
        literal(DeliveryStatus.PENDING.value),
        literal(0),
        literal(0),
        at_ts,
        at_ts,
    ).where(requests_t.c.id.in_(request_ids), requests_t.c.webhook_url.is_not(None))
    columns = [
        "id",
        "request_id",
        "tenant",
        "url",
        "event_type",
        "status",
        "attempts",
        "run_attempts",
        "next_attempt_at",
        "created_at",
    ]
    return insert(deliveries_t).from_select(columns, rows)


def expire_stmt(now: float, reason: str, from_state: RequestState = S.QUEUED) -> Any:
    return (
        update(requests_t)
        .where(requests_t.c.state == from_state.value)
        .values(
            state=S.EXPIRED.value,
            error_code=ErrorCode.DEADLINE_EXCEEDED.value,
            error_message=reason,
            finished_at=from_epoch(now),
        )
    )


def epoch(value: Any) -> float:
    dt = aware(value)
    assert dt is not None
    return dt.timestamp()
