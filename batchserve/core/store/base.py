"""Shared plumbing of the job store: the engine, change notifications, small helpers."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, case, insert, literal, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from batchserve.core import lifecycle
from batchserve.core.db import Statements, is_postgres
from batchserve.core.domain import (
    BatchItem,
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
from batchserve.core.lifecycle import Cause
from batchserve.core.logs import get_logger, log_request_ids
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
LOG_CHUNK = 1000  # ids per request_events/outbox statement and per reported change
# Records carried on one notification, in characters of output and error messages: a larger
# change's waiters each read their own (every subscriber decodes every notification).
NOTIFIED_OUTPUT_MAX_CHARS = 64 * 1024
_HAS_WEBHOOK = requests_t.c.webhook_url.is_not(None).label("has_webhook")


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

    def item(
        self,
        received_at: float,
        *,
        deadline: float | None = None,
        time_limit_s: float | None = None,
    ) -> BatchItem:
        """The request as a worker runs it."""
        return BatchItem(
            request_id=self.id,
            input=self.input,
            messages=self.messages,
            params=self.params,
            created_at=self.created_at,
            received_at=received_at,
            deadline=deadline,
            time_limit_s=time_limit_s,
        )


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
class Ended:
    """Requests a transaction ended, to report once it commits; ``rows``: what was read back;
    ``records``: where the statement read them back whole, the requests as they now are, in
    the order of ``ids`` (the notification carries them to the waiters)."""

    state: RequestState
    ids: tuple[str, ...]
    rows: tuple[Any, ...] = ()
    records: tuple[RequestRecord, ...] = ()


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
        statements: Statements | None = None,
    ) -> None:
        self.engine = engine
        # Postgres only: the hot single statements (admission, a request's read) go through
        # psycopg's pool instead of the engine (batchserve/core/db.py says why).
        self.statements = statements if is_postgres(engine) else None
        self.max_failures = max_failures
        self._on_change = on_change
        self._postgres = is_postgres(engine)

    async def _end(
        self,
        conn: AsyncConnection,
        cause: Cause,
        state: RequestState,
        *where: Any,
        now: float,
        code: str | None,
        message: str | None,
        source: RequestState | None = None,
        batch_id: uuid.UUID | None = None,
        returning: Sequence[Any] = (),
        **values: Any,
    ) -> Ended:
        """End the requests ``where`` selects, in the caller's transaction: the move from the
        states the lifecycle lets ``cause`` leave (or from ``source`` alone), with its error and
        finish time, and its events and webhook deliveries (:meth:`_log_ended`). The one way
        a request ends, but for a batch's results (written per row, then logged the same way).

        ``returning``: more columns to read back from each ended row (:attr:`Ended.rows`).
        """
        extra = [c for c in returning if c is not requests_t.c.id]
        stmt = (
            moving(cause, state, source=source)
            .where(*where)
            .values(error_code=code, error_message=message, finished_at=from_epoch(now), **values)
            .returning(requests_t.c.id, _HAS_WEBHOOK, *extra)
        )
        rows = (await conn.execute(stmt)).mappings().all()
        written = [(str(r["id"]), bool(r[_HAS_WEBHOOK.name])) for r in rows]
        ended = await self._log_ended(conn, state, written, now, batch_id)
        return Ended(state=ended.state, ids=ended.ids, rows=tuple(rows))

    async def _expire(
        self,
        conn: AsyncConnection,
        *where: Any,
        now: float,
        reason: str,
        source: RequestState = S.QUEUED,
        batch_id: uuid.UUID | None = None,
    ) -> Ended:
        """End the requests in ``source`` that ``where`` selects as past their deadline."""
        return await self._end(
            conn,
            Cause.DEADLINE,
            S.EXPIRED,
            *where,
            now=now,
            code=ErrorCode.DEADLINE_EXCEEDED.value,
            message=reason,
            source=source,
            batch_id=batch_id,
        )

    @staticmethod
    async def _log_ended(
        conn: AsyncConnection,
        state: RequestState,
        written: Sequence[tuple[str, bool]],
        now: float,
        batch_id: uuid.UUID | None = None,
    ) -> Ended:
        """Append the terminal transitions of requests just moved to ``state``, in the
        transaction that moved them, and queue the webhook delivery of each that asked for one
        (the outbox: no result is ever committed without its delivery, nor a delivery without
        its result). Returns what to report once it commits (:meth:`_notify`).

        ``written``: (request id, whether it may have a webhook URL); the outbox insert reads
        the URL and is skipped when none may.
        """
        assert state.terminal, state
        at = from_epoch(now)
        for first in range(0, len(written), LOG_CHUNK):
            chunk = written[first : first + LOG_CHUNK]
            request_ids = [uuid.UUID(i) for i, _ in chunk]
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
            hooked = [uuid.UUID(i) for i, has_webhook in chunk if has_webhook]
            if hooked:
                await conn.execute(outbox_insert(hooked, state, at))
        return Ended(state=state, ids=tuple(i for i, _ in written))

    async def _notify(self, ended: Ended, **fields: Any) -> None:
        """Report requests a committed transaction ended, ``LOG_CHUNK`` ids per change, with
        their records where it has them and they are not too large to carry."""
        for first in range(0, len(ended.ids), LOG_CHUNK):
            records = ended.records[first : first + LOG_CHUNK]
            carried = sum(len(r.output or "") + len(r.error_message or "") for r in records)
            await self._emit(
                ended.state,
                ended.ids[first : first + LOG_CHUNK],
                records=records if carried <= NOTIFIED_OUTPUT_MAX_CHARS else (),
                **fields,
            )

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
    log_request_ids(log, f"requests_{state.value}", ids, batch_id=batch_id, model=model)


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


def state_in(states: Iterable[RequestState]) -> Any:
    """``requests.state`` is one of ``states``."""
    stored = lifecycle.values(frozenset(states))
    if len(stored) == 1:
        return requests_t.c.state == stored[0]
    return requests_t.c.state.in_(stored)


def moving(
    cause: Cause, target: RequestState | None = None, *, source: RequestState | None = None
) -> Any:
    """``UPDATE requests`` of the rows ``cause`` may move to ``target`` (the lifecycle's
    source states, or ``source`` alone among them), setting their state; with no ``target``,
    of rows it may move to any of its targets, the caller setting which (one a row)."""
    if target is None:
        allowed = lifecycle.common_sources(cause)
    else:
        allowed = lifecycle.sources(cause, target)
    if source is not None:
        if source not in allowed:
            raise ValueError(f"{cause.value} does not move a request from {source.value}")
        allowed = (source,)
    stmt = update(requests_t).where(state_in(allowed))
    return stmt if target is None else stmt.values(state=target.value)


def epoch(value: Any) -> float:
    dt = aware(value)
    assert dt is not None
    return dt.timestamp()
