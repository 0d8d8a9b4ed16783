"""Batch verbs of the job store: claim, start, lease, complete, reap, and requeue."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    bindparam,
    case,
    func,
    insert,
    literal,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core import lifecycle
from batchserve.core.db import autocommit, transaction
from batchserve.core.domain import (
    BatchOutcome,
    DeliveryStatus,
    ErrorCode,
    ItemResult,
    RequestRecord,
    Timings,
    from_epoch,
)
from batchserve.core.lifecycle import Cause
from batchserve.core.metrics import metrics
from batchserve.core.records import (
    MESSAGE_COLUMNS,
    RECORD_COLUMNS,
    pg_type,
    row_message,
    row_record,
    rows_document,
    rows_from,
)
from batchserve.core.store.base import (
    BatchStart,
    ClaimedRequest,
    Ended,
    ExpiredLease,
    ItemOutcome,
    Reaped,
    S,
    StoreBase,
    batches_t,
    epoch,
    moving,
    new_delivery_id,
    requests_t,
)


def lease_expired(now: float) -> tuple[ColumnElement[bool], ...]:
    """Open batches whose lease ran out by ``now``."""
    return (batches_t.c.outcome.is_(None), batches_t.c.lease_expires_at < from_epoch(now))


class FinishedSequence(NamedTuple):
    """An engine model's request that ran to the end."""

    finished_at: float
    prompt_tokens: int
    generated_tokens: int
    seconds: float  # in the engine
    id: uuid.UUID


class FinishedBatch(NamedTuple):
    """A batch that ran to the end."""

    finished_at: float
    size: int
    prompt_tokens: int
    max_new_tokens: int
    seconds: float  # model time
    id: uuid.UUID


# The dispatch path's statements, built once: SQLAlchemy then reuses their compiled form and
# cache key, where building them per call cost more client CPU than running them (a lease:
# 4.7 against 1.9 ms of CPU, isolated, on the 2-core bench machine).
_CLAIM = (
    moving(Cause.CLAIM, S.RUNNING)
    .where(
        requests_t.c.id.in_(bindparam("ids", expanding=True)),
        requests_t.c.model == bindparam("claim_model"),
    )
    .values(
        batch_id=bindparam("claim_batch"),
        attempts=requests_t.c.attempts + 1,
    )
    .returning(*(requests_t.c[f.name] for f in fields(ClaimedRequest)))
)
_INSERT_BATCH = insert(batches_t)
_TAKE_LEASE = (
    update(batches_t)
    .where(
        batches_t.c.id == bindparam("batch"),
        batches_t.c.outcome.is_(None),
        (batches_t.c.attempt == 0) | (batches_t.c.lease_expires_at < bindparam("now")),
    )
    .values(
        attempt=batches_t.c.attempt + 1,
        worker=bindparam("by"),
        started_at=func.coalesce(batches_t.c.started_at, bindparam("now")),
        lease_expires_at=bindparam("until"),
    )
    .returning(batches_t.c.attempt, batches_t.c.isolation_group)
)
_QUEUED_INPUTS = select(*(requests_t.c[f.name] for f in fields(ClaimedRequest))).where(
    requests_t.c.id.in_(bindparam("ids", expanding=True)),
    requests_t.c.state == S.QUEUED.value,
)
_QUEUED_INPUTS_PG = (
    "SELECT " + ", ".join(f.name for f in fields(ClaimedRequest)) + " FROM requests"
    " WHERE id = ANY(%(ids)s) AND state = '" + S.QUEUED.value + "'"
)
_PLACEMENTS = select(requests_t.c.id, requests_t.c.state, requests_t.c.batch_id).where(
    requests_t.c.id.in_(bindparam("ids", expanding=True))
)
_PLACEMENTS_PG = "SELECT id, state, batch_id FROM requests WHERE id = ANY(%(ids)s)"
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")
# join_batch through the engine: the batch open and leased by this attempt, then its growth.
_HELD = (
    select(batches_t.c.id)
    .where(
        batches_t.c.id == bindparam("batch"),
        batches_t.c.outcome.is_(None),
        batches_t.c.attempt == bindparam("attempt"),
    )
    .with_for_update()
)
_GROW = (
    update(batches_t)
    .where(batches_t.c.id == bindparam("batch"))
    .values(size=batches_t.c.size + bindparam("joined"))
)
_LIVE_MEMBERS = select(requests_t.c.id).where(
    requests_t.c.batch_id == bindparam("batch"), requests_t.c.state == S.RUNNING.value
)
_STARTED = _TAKE_LEASE.cte("started")
# Postgres: the lease and the members still waiting, in one statement.
_START = select(
    _STARTED.c.attempt,
    _STARTED.c.isolation_group,
    _LIVE_MEMBERS.with_only_columns(func.array_agg(requests_t.c.id)).scalar_subquery(),
)


class BatchVerbs(StoreBase):
    async def claim_batch(
        self,
        *,
        batch_id: uuid.UUID,
        model: str,
        request_ids: Sequence[str],
        now: float,
        estimated_s: float,
        lease_until: float,
        isolation_group: str | None = None,
    ) -> list[ClaimedRequest]:
        """Move queued requests to running under a new batch; the rest are left alone.

        On Postgres one statement in autocommit through the statements pool: the claim and the
        batch's row in one round trip (the dispatch waits for it)."""
        ids = [uuid.UUID(i) for i in request_ids]
        batch = {  # the batch's row, less its size and attempt
            "id": batch_id,
            "model": model,
            "isolation_group": isolation_group,
            "estimated_ms": estimated_s * 1000.0,
            "dispatched_at": from_epoch(now),
            "lease_expires_at": from_epoch(lease_until),
        }
        if self.statements is not None:
            rows: Sequence[Mapping[Any, Any]] = await self.statements.fetchall(
                _CLAIM_PG, {**batch, "ids": ids}
            )
        else:
            async with transaction(self.engine) as conn:
                params = {"ids": ids, "claim_model": model, "claim_batch": batch_id}
                rows = (await conn.execute(_CLAIM, params)).mappings().all()
                if rows:
                    await conn.execute(_INSERT_BATCH, {**batch, "size": len(rows), "attempt": 0})
        claimed = [_claimed(r) for r in rows]
        if claimed:
            await self._emit(
                S.RUNNING, [c.id for c in claimed], batch_id=str(batch_id), model=model
            )
        return claimed

    async def join_batch(
        self, batch_id: uuid.UUID, *, attempt: int, model: str, request_ids: Sequence[str]
    ) -> list[ClaimedRequest]:
        """Claim late joiners into a batch whose model is about to start (``joins.py``): the
        requests still queued move to running under it, only while ``attempt`` holds its lease
        and it is open, and its size grows by them. The rest are left alone (the batcher
        batches them again)."""
        ids = [uuid.UUID(i) for i in request_ids]
        if not ids:
            return []
        if self.statements is not None:
            params = {"batch": batch_id, "attempt": attempt, "model": model, "ids": ids}
            rows: Sequence[Mapping[Any, Any]] = await self.statements.fetchall(_JOIN_PG, params)
        else:
            async with transaction(self.engine) as conn:
                held = await conn.execute(_HELD, {"batch": batch_id, "attempt": attempt})
                if held.first() is None:
                    return []
                params = {"ids": ids, "claim_model": model, "claim_batch": batch_id}
                rows = (await conn.execute(_CLAIM, params)).mappings().all()
                if rows:
                    await conn.execute(_GROW, {"batch": batch_id, "joined": len(rows)})
        claimed = [_claimed(r) for r in rows]
        if claimed:
            await self._emit(
                S.RUNNING, [c.id for c in claimed], batch_id=str(batch_id), model=model
            )
        return claimed

    async def queued_inputs(self, request_ids: Sequence[str]) -> list[ClaimedRequest]:
        """What a worker runs of each of these requests still queued (the batcher reads it to
        offer late joiners; nothing changes)."""
        ids = [uuid.UUID(i) for i in request_ids]
        if not ids:
            return []
        if self.statements is not None:
            rows: Sequence[Mapping[Any, Any]] = await self.statements.fetchall(
                _QUEUED_INPUTS_PG, {"ids": ids}
            )
        else:
            async with autocommit(self.engine) as conn:
                rows = (await conn.execute(_QUEUED_INPUTS, {"ids": ids})).mappings().all()
        return [_claimed(r) for r in rows]

    async def joined_members(
        self, batch_id: uuid.UUID, request_ids: Sequence[str]
    ) -> list[ClaimedRequest]:
        """Which of ``request_ids`` run under the batch now (a worker whose join's answer was
        lost reads what it claimed)."""
        ids = [uuid.UUID(i) for i in request_ids]
        query = select(*(requests_t.c[f.name] for f in fields(ClaimedRequest))).where(
            requests_t.c.batch_id == bindparam("batch"),
            requests_t.c.state == S.RUNNING.value,
            requests_t.c.id.in_(bindparam("ids", expanding=True)),
        )
        async with autocommit(self.engine) as conn:
            rows = (await conn.execute(query, {"batch": batch_id, "ids": ids})).mappings().all()
        return [_claimed(r) for r in rows]

    async def states_of(self, request_ids: Sequence[str]) -> dict[str, S]:
        """The state of each of these requests that exists."""
        return {r: state for r, (state, _) in (await self.placements_of(request_ids)).items()}

    async def placements_of(
        self, request_ids: Sequence[str]
    ) -> dict[str, tuple[S, uuid.UUID | None]]:
        """The state of each of these requests that exists, and the batch it ran in last."""
        ids = [uuid.UUID(i) for i in request_ids]
        if not ids:
            return {}
        if self.statements is not None:  # one prepared statement, whatever the count
            found = await self.statements.fetchall(_PLACEMENTS_PG, {"ids": ids})
            return {str(r["id"]): (S(r["state"]), r["batch_id"]) for r in found}
        async with autocommit(self.engine) as conn:
            rows = (await conn.execute(_PLACEMENTS, {"ids": ids})).all()
        return {str(r[0]): (S(r[1]), r[2]) for r in rows}

    async def start_batch(
        self, batch_id: uuid.UUID, worker: str, now: float, lease_s: float
    ) -> BatchStart | Reaped | None:
        """Take the batch's lease and learn which members still wait for it.

        ``None`` when the batch is finished, reaped, or held by a live worker (a duplicate
        delivery). A batch started before whose lease has run out belonged to a worker that died:
        it is reaped as crashed (members requeued in halves) rather than run again whole, and the
        :class:`Reaped` says what to republish.

        The model waits for this, so it touches no row but the batch's own (never waiting for
        an earlier batch's results write) and, on Postgres, is one statement in autocommit:
        one round trip. ``worker`` runs one model at a time: that it started this batch is what
        tells the reaper that its earlier batches' models had finished (see :meth:`reap_batch`).
        """
        params = {
            "batch": batch_id,
            "now": from_epoch(now),
            "by": worker,
            "until": from_epoch(now + lease_s),
        }
        if self.statements is not None:
            # The members are read in the statement's snapshot, taken before the batch row is
            # locked: a member cancelled in between still runs, and its write is fenced out.
            found = await self.statements.fetchone(_START_PG, params)
            if found is None:
                return None
            leased: tuple[Any, ...] = (found["attempt"], found["isolation_group"])
            live_ids = frozenset(str(i) for i in found["live"] or ())
        elif self._postgres:
            async with autocommit(self.engine) as conn:
                row = (await conn.execute(_START, params)).first()
            if row is None:
                return None
            leased = tuple(row)
            live_ids = frozenset(str(i) for i in row[2] or ())
        else:
            async with transaction(self.engine) as conn:
                row = (await conn.execute(_TAKE_LEASE, params)).first()
                if row is None:
                    return None
                leased = tuple(row)
                live = await conn.execute(_LIVE_MEMBERS, {"batch": batch_id})
                live_ids = frozenset(str(r[0]) for r in live)
        attempt, isolating = int(leased[0]), leased[1] is not None
        if attempt > 1:
            return await self.reap_batch(batch_id, now=now, outcome=BatchOutcome.CRASHED)
        return BatchStart(attempt=attempt, live_ids=live_ids, isolating=isolating)

    async def _renewing(self, conn: AsyncConnection) -> None:
        """A renewal's commit does not wait for Postgres's WAL flush: a disk busy with other
        writes (a checkpoint, another database being copied) then cannot hold it past the
        lease it extends. Were Postgres to crash before the flush, the renewal is lost and the
        batch may be reaped once its earlier expiry passes: its results are fenced out and its
        requests run again; nothing is lost or answered twice."""
        if self._postgres:
            await conn.execute(_ASYNC_COMMIT)

    async def renew_lease(
        self, batch_id: uuid.UUID, worker: str, attempt: int, until: float
    ) -> bool:
        async with transaction(self.engine) as conn:
            await self._renewing(conn)
            result = await conn.execute(
                update(batches_t)
                .where(
                    batches_t.c.id == batch_id,
                    batches_t.c.outcome.is_(None),
                    batches_t.c.worker == worker,
                    batches_t.c.attempt == attempt,
                )
                .values(lease_expires_at=from_epoch(until))
            )
        return bool(result.rowcount)

    async def ended_by(self, batch_id: uuid.UUID, attempt: int) -> bool:
        """Whether ``attempt`` ended the batch with its results: a renewal that finds the lease
        gone may have run just after that attempt's own write, not after a reap."""
        query = select(batches_t.c.outcome).where(
            batches_t.c.id == batch_id, batches_t.c.attempt == attempt
        )
        async with transaction(self.engine) as conn:
            outcome = (await conn.execute(query)).scalar_one_or_none()
        return outcome == BatchOutcome.SUCCEEDED.value

    async def renew_leases(
        self, held: Sequence[tuple[uuid.UUID, str]], until: float
    ) -> set[uuid.UUID]:
        """Renew the leases of many open batches, each held by its own worker name, in one
        statement (an engine worker holds one per batch it runs); returns those still held."""
        if not held:
            return set()
        async with transaction(self.engine) as conn:
            await self._renewing(conn)
            rows = await conn.execute(
                update(batches_t)
                .where(
                    tuple_(batches_t.c.id, batches_t.c.worker).in_(list(held)),
                    batches_t.c.outcome.is_(None),
                )
                .values(lease_expires_at=from_epoch(until))
                .returning(batches_t.c.id)
            )
            return {r[0] for r in rows}

    async def complete_batch(
        self,
        batch_id: uuid.UUID,
        *,
        attempt: int,
        outcomes: Sequence[ItemOutcome],
        failed_alone: Sequence[tuple[str, str]] = (),
        now: float,
        model_ms: float,
        prompt_tokens: int = 0,
        max_new_tokens: int = 0,
        generated_tokens: int = 0,
    ) -> Reaped | None:
        """Write a batch's results in one transaction; ``None`` when this attempt is stale.

        ``failed_alone`` lists members that made the model raise even when run alone (with the
        error): each is charged a failure and requeued alone, or failed once its budget is spent.
        """
        closing = {
            "outcome": BatchOutcome.SUCCEEDED.value,
            "model_ms": model_ms,
            "prompt_tokens": prompt_tokens,
            "max_new_tokens": max_new_tokens,
            "generated_tokens": generated_tokens,
        }
        if self.statements is not None and not failed_alone:
            return await self._complete_in_one(batch_id, attempt, outcomes, now, closing)
        now_dt = from_epoch(now)
        async with transaction(self.engine) as conn:
            closed = await conn.execute(
                update(batches_t)
                .where(
                    batches_t.c.id == batch_id,
                    batches_t.c.outcome.is_(None),
                    batches_t.c.attempt == attempt,
                )
                .values(finished_at=now_dt, **closing)
            )
            if not closed.rowcount:
                return None
            live = (
                await self._lock_running(conn, batch_id)
                if failed_alone or not self._postgres
                else None
            )
            ended = await self._write_outcomes(conn, batch_id, outcomes, live, now)
            charged = Reaped()
            for request_id, error in failed_alone:
                assert live is not None
                if request_id in live:
                    one = {request_id: live[request_id]}
                    charged = charged.merge(await self._charge(conn, one, now=now, error=error))
        for each in ended:
            await self._notify(each, batch_id=str(batch_id))
        await self._emit_reaped(charged)
        return charged

    async def _complete_in_one(
        self,
        batch_id: uuid.UUID,
        attempt: int,
        outcomes: Sequence[ItemOutcome],
        now: float,
        closing: Mapping[str, Any],
    ) -> Reaped | None:
        """The batch closed, its results written, their transitions logged and their webhook
        deliveries queued: one statement (``_COMPLETE_PG``) in autocommit through the
        statements pool, one round trip where the transaction took five. ``None`` when this
        attempt is stale."""
        assert self.statements is not None
        now_dt = from_epoch(now)
        rows = [result_row(o, now_dt) for o in outcomes]
        params: dict[str, Any] = {
            "rows": results_document(rows, [new_delivery_id() for _ in rows]),
            # the batch's own figures, apart from its members' columns
            **{f"batch_{name}": value for name, value in closing.items()},
            "batch_id": batch_id,
            "attempt": attempt,
            "now": now_dt,
        }
        found = await self.statements.fetchall(_COMPLETE_PG, params)
        if not found:
            return None
        by_state: dict[S, list[RequestRecord]] = {state: [] for state in _RESULT_STATES}
        for row in found:
            if row["id"] is not None:  # the batch closed with no member still running
                record = row_record(row)
                by_state[record.state].append(record)
        for state, records in by_state.items():
            ids = tuple(str(r.id) for r in records)
            ended = Ended(state=state, ids=ids, records=tuple(records))
            await self._notify(ended, batch_id=str(batch_id))
        return Reaped()

    async def complete_items(
        self, batch_id: uuid.UUID, *, attempt: int, outcomes: Sequence[ItemOutcome], now: float
    ) -> list[str] | None:
        """Write the results of members that finished before the rest of their batch, so a
        short answer need not wait for a long one. ``None`` when this attempt is stale."""
        ids = [uuid.UUID(o.result.request_id) for o in outcomes]
        async with transaction(self.engine) as conn:
            owned = select(batches_t.c.id).where(
                batches_t.c.id == batch_id,
                batches_t.c.outcome.is_(None),
                batches_t.c.attempt == attempt,
            )
            if self._postgres:
                owned = owned.with_for_update()  # the reaper waits for this write, or wins
            if (await conn.execute(owned)).first() is None:
                return None
            live = (
                None
                if self._postgres
                else await self._lock_running(conn, batch_id, [str(i) for i in ids])
            )
            ended = await self._write_outcomes(conn, batch_id, outcomes, live, now)
        for each in ended:
            await self._notify(each, batch_id=str(batch_id))
        return [i for each in ended for i in each.ids]

    async def expire_running(
        self, batch_id: uuid.UUID, *, attempt: int, request_ids: Sequence[str], now: float
    ) -> list[str] | None:
        """End running members whose deadline passed while their engine ran them (their
        sequences are stopped); ``None`` when this attempt is stale."""
        ids = [uuid.UUID(i) for i in request_ids]
        async with transaction(self.engine) as conn:
            owned = select(batches_t.c.id).where(
                batches_t.c.id == batch_id,
                batches_t.c.outcome.is_(None),
                batches_t.c.attempt == attempt,
            )
            if self._postgres:
                owned = owned.with_for_update()
            if (await conn.execute(owned)).first() is None:
                return None
            ended = await self._expire(
                conn,
                requests_t.c.id.in_(ids),
                requests_t.c.batch_id == batch_id,
                now=now,
                reason="the deadline passed while it ran",
                source=S.RUNNING,
                batch_id=batch_id,
            )
        await self._notify(ended, batch_id=str(batch_id))
        return list(ended.ids)

    async def running_members(self, model: str) -> list[tuple[uuid.UUID, str, int, int]]:
        """Requests of ``model`` running now: (batch, request id, prompt tokens, max tokens).
        What an engine model's batcher counts against its engines' capacity."""
        query = select(
            requests_t.c.batch_id,
            requests_t.c.id,
            requests_t.c.est_prompt_tokens,
            requests_t.c.max_tokens,
        ).where(requests_t.c.model == model, requests_t.c.state == S.RUNNING.value)
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [(r[0], str(r[1]), int(r[2] or 0), int(r[3] or 0)) for r in rows]

    async def finished_sequences(
        self, model: str, *, after: float | None = None, limit: int = 500
    ) -> list[FinishedSequence]:
        """Requests of an engine model that ran to the end, newest last. The learned sequence
        time's data."""
        query = select(
            requests_t.c.finished_at,
            requests_t.c.prompt_tokens,
            requests_t.c.completion_tokens,
            requests_t.c.model_ms,
            requests_t.c.id,
        ).where(
            requests_t.c.model == model,
            requests_t.c.state == S.SUCCEEDED.value,
            requests_t.c.model_ms.is_not(None),
        )
        if after is not None:
            query = query.where(requests_t.c.finished_at > from_epoch(after))
        query = query.order_by(requests_t.c.finished_at.desc()).limit(limit)
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [
            FinishedSequence(
                epoch(r[0]), int(r[1] or 0), int(r[2] or 0), float(r[3]) / 1000.0, r[4]
            )
            for r in reversed(rows)
        ]

    async def reap_batch(self, batch_id: uuid.UUID, *, now: float, outcome: BatchOutcome) -> Reaped:
        """Close a batch whose worker died (crashed) or never started it (abandoned).

        Members still running go back to the queue: after a crash in halves, each half its own
        isolation group, so a request that kills every batch it joins is cornered in about
        ``2*log2(size)`` batches; a lone member is charged a failure.
        """
        async with transaction(self.engine) as conn:
            closed = (
                await conn.execute(
                    update(batches_t)
                    .where(batches_t.c.id == batch_id, batches_t.c.outcome.is_(None))
                    .values(
                        # A crashed batch whose model had finished was only taken down while
                        # writing, by a later batch: its members are no suspects. A worker runs
                        # one model at a time, so a later start of its means this one's ended.
                        outcome=case(
                            (
                                _worker_started_later()
                                & (literal(outcome.value) == BatchOutcome.CRASHED.value),
                                BatchOutcome.ABANDONED.value,
                            ),
                            else_=outcome.value,
                        ),
                        finished_at=from_epoch(now),
                    )
                    .returning(batches_t.c.isolation_group, batches_t.c.outcome)
                )
            ).first()
            if closed is None:
                return Reaped()
            live = await self._lock_running(conn, batch_id)
            outcome = BatchOutcome(closed[1])
            if not live:
                reaped = Reaped()
            elif outcome is BatchOutcome.CRASHED and len(live) == 1:
                reaped = await self._charge(conn, live, now=now, error="the worker died running it")
            else:
                groups: dict[str, str | None]
                if outcome is BatchOutcome.CRASHED:
                    half = (len(live) + 1) // 2
                    groups = {
                        rid: f"{batch_id}:{0 if n < half else 1}" for n, rid in enumerate(live)
                    }
                else:
                    groups = dict.fromkeys(live, closed[0])
                reaped = await self._requeue(conn, groups, now=now)
        await self._emit_reaped(reaped)
        return reaped

    async def expired_leases(self, now: float, limit: int = 100) -> list[ExpiredLease]:
        """Open batches whose lease ran out (maintenance reaps them)."""
        query = (
            select(batches_t.c.id, batches_t.c.model, batches_t.c.attempt)
            .where(*lease_expired(now))
            .limit(limit)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [ExpiredLease(batch_id=r[0], model=r[1], started=r[2] > 0) for r in rows]

    async def open_batches(self, model: str) -> list[tuple[uuid.UUID, float]]:
        """Batches of a model not yet finished, with their lease expiry (batcher start-up)."""
        query = select(batches_t.c.id, batches_t.c.lease_expires_at).where(
            batches_t.c.model == model, batches_t.c.outcome.is_(None)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [(r[0], epoch(r[1])) for r in rows]

    async def finished_batches(
        self, model: str, *, after: float | None = None, limit: int = 500
    ) -> list[FinishedBatch]:
        """Batches of ``model`` that ran to the end, newest last. What the learned batch time
        is fitted on."""
        query = select(
            batches_t.c.finished_at,
            batches_t.c.size,
            batches_t.c.prompt_tokens,
            batches_t.c.max_new_tokens,
            batches_t.c.model_ms,
            batches_t.c.id,
        ).where(
            batches_t.c.model == model,
            batches_t.c.outcome == BatchOutcome.SUCCEEDED.value,
            batches_t.c.model_ms.is_not(None),
        )
        if after is not None:
            query = query.where(batches_t.c.finished_at > from_epoch(after))
        query = query.order_by(batches_t.c.finished_at.desc()).limit(limit)
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [
            FinishedBatch(
                epoch(r[0]), int(r[1]), int(r[2] or 0), int(r[3] or 0), float(r[4]) / 1000.0, r[5]
            )
            for r in reversed(rows)
        ]

    async def _write_outcomes(
        self,
        conn: AsyncConnection,
        batch_id: uuid.UUID,
        outcomes: Sequence[ItemOutcome],
        live: Mapping[str, Any] | None,
        now: float,
    ) -> list[Ended]:
        """Store results of the members still running under this batch; log their transitions.

        ``live``: the members already locked (SQLite path); ``None`` lets Postgres find them in
        the same statement that writes them.
        """
        now_dt = from_epoch(now)
        if self._postgres and live is None:
            written = await self._write_outcomes_pg(conn, batch_id, outcomes, now_dt)
        else:
            written = await self._write_outcomes_each(conn, batch_id, outcomes, live or {}, now_dt)
        by_state: dict[S, list[tuple[str, bool]]] = {state: [] for state in _RESULT_STATES}
        records: dict[S, list[RequestRecord]] = {state: [] for state in _RESULT_STATES}
        for request_id, state, has_webhook, record in written:
            by_state[S(state)].append((request_id, has_webhook))
            if record is not None:
                records[S(state)].append(record)
        ended = []
        for state, rows in by_state.items():
            logged = await self._log_ended(conn, state, rows, now, batch_id)
            if len(records[state]) == len(logged.ids):  # read back whole (Postgres)
                logged = dataclasses.replace(logged, records=tuple(records[state]))
            ended.append(logged)
        return ended

    async def _write_outcomes_pg(
        self,
        conn: AsyncConnection,
        batch_id: uuid.UUID,
        outcomes: Sequence[ItemOutcome],
        now_dt: Any,
    ) -> list[tuple[str, str, bool, RequestRecord | None]]:
        """One ``UPDATE ... FROM jsonb_to_recordset RETURNING``: a round trip for the whole batch,
        and the same SQL text whatever its size, so Postgres prepares it once. Each written
        request comes back whole, for its notification."""
        if not outcomes:
            return []
        rows = [result_row(o, now_dt) for o in outcomes]
        params = {"rows": results_document(rows), "batch_id": batch_id}
        result = (await conn.execute(_WRITE_OUTCOMES_PG, params)).mappings()
        return [
            (str(r["id"]), r["state"], r["webhook_url"] is not None, row_record(r)) for r in result
        ]

    async def _write_outcomes_each(
        self,
        conn: AsyncConnection,
        batch_id: uuid.UUID,
        outcomes: Sequence[ItemOutcome],
        live: Mapping[str, Any],
        now_dt: Any,
    ) -> list[tuple[str, str, bool, RequestRecord | None]]:
        rows = [result_row(o, now_dt) for o in outcomes if o.result.request_id in live]
        if not rows:
            return []
        await conn.execute(
            moving(Cause.RESULT)
            .where(requests_t.c.id == bindparam("b_id"), requests_t.c.batch_id == batch_id)
            .values({name: bindparam(f"b_{name}") for name in RESULT_FIELDS}),
            rows,
        )
        # The update returns nothing here: read the requests it wrote back whole, once for the
        # batch, for their notification (each caller waiting on one is answered from it, not
        # from a read of its own) and to know which asked for a webhook.
        found = await conn.execute(
            select(*RECORD_COLUMNS).where(requests_t.c.id.in_([r["b_id"] for r in rows]))
        )
        read = {str(r["id"]): r for r in found.mappings()}
        written: list[tuple[str, str, bool, RequestRecord | None]] = []
        for row in rows:
            request_id = str(row["b_id"])
            back = read.get(request_id)
            if back is None:  # not expected: the transaction holds the database
                written.append((request_id, row["b_state"], True, None))
            else:
                hooked = back["webhook_url"] is not None
                written.append((request_id, back["state"], hooked, row_record(back)))
        return written

    async def _lock_running(
        self, conn: AsyncConnection, batch_id: uuid.UUID, only: Sequence[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        query = select(
            requests_t.c.id,
            requests_t.c.deadline,
            requests_t.c.failures,
            requests_t.c.batch_id,
            *MESSAGE_COLUMNS[1:],
        ).where(requests_t.c.batch_id == batch_id, requests_t.c.state == S.RUNNING.value)
        if only is not None:
            query = query.where(requests_t.c.id.in_([uuid.UUID(i) for i in only]))
        if self._postgres:
            query = query.order_by(requests_t.c.id).with_for_update()
        rows = (await conn.execute(query)).mappings().all()
        return {str(r["id"]): dict(r) for r in rows}

    async def _charge(
        self, conn: AsyncConnection, live: dict[str, dict[str, Any]], *, now: float, error: str
    ) -> Reaped:
        ((request_id, row),) = live.items()
        failures = row["failures"] + 1
        if failures < self.max_failures and epoch(row["deadline"]) > now:
            await conn.execute(
                update(requests_t)
                .where(requests_t.c.id == uuid.UUID(request_id))
                .values(failures=failures)
            )
            requeued = await self._requeue(conn, {request_id: f"solo:{request_id}"}, now=now)
            return requeued.merge(Reaped(charged=(request_id,)))
        ended = await self._end(
            conn,
            Cause.POISON,
            S.FAILED,
            requests_t.c.id == uuid.UUID(request_id),
            now=now,
            code=ErrorCode.POISON.value,
            message=f"failed alone {failures} time(s); last error: {error}"[:2000],
            batch_id=row["batch_id"],
            failures=failures,
        )
        return Reaped(failed=ended.ids, charged=(request_id,))

    async def _requeue(
        self, conn: AsyncConnection, groups: Mapping[str, str | None], *, now: float
    ) -> Reaped:
        ids = [uuid.UUID(i) for i in groups]
        ended = (
            await self._expire(
                conn,
                requests_t.c.id.in_(ids),
                requests_t.c.deadline <= from_epoch(now),
                now=now,
                reason="deadline passed before a retry could run",
                source=S.RUNNING,
            )
        ).ids
        for group in set(groups.values()):
            members = [uuid.UUID(i) for i, g in groups.items() if g == group and i not in ended]
            if members:
                await conn.execute(
                    moving(Cause.REQUEUE, S.QUEUED)
                    .where(requests_t.c.id.in_(members))
                    .values(isolation_group=group, published_at=None)
                )
        rows = (
            (
                await conn.execute(
                    select(*MESSAGE_COLUMNS).where(
                        requests_t.c.id.in_(ids), requests_t.c.state == S.QUEUED.value
                    )
                )
            )
            .mappings()
            .all()
        )
        return Reaped(requeued=tuple(row_message(r) for r in rows), expired=ended)

    async def _emit_reaped(self, reaped: Reaped) -> None:
        for message in reaped.requeued:
            metrics().retries.labels(message.model).inc()
        if reaped.charged:
            metrics().poison_isolations.inc(len(reaped.charged))
        await self._emit(S.FAILED, reaped.failed)
        await self._emit(S.EXPIRED, reaped.expired)
        await self._emit(S.QUEUED, [m.id for m in reaped.requeued])


_RESULT_STATES = lifecycle.targets(Cause.RESULT)
# A result's columns: an ItemResult's fields and its Timings' are named as their columns.
_ITEM_FIELDS = tuple(f.name for f in fields(ItemResult) if f.name != "request_id")
_TIMING_FIELDS = tuple(f.name for f in fields(Timings))
RESULT_FIELDS = ("state", *_ITEM_FIELDS, *_TIMING_FIELDS, "finished_at")


def result_row(outcome: ItemOutcome, now: Any) -> dict[str, Any]:
    result, timings = outcome.result, outcome.timings
    state = S.SUCCEEDED if result.ok else S.FAILED
    row: dict[str, Any] = {"b_id": uuid.UUID(result.request_id), "b_state": state.value}
    row.update({f"b_{name}": getattr(result, name) for name in _ITEM_FIELDS})
    row.update({f"b_{name}": getattr(timings, name) for name in _TIMING_FIELDS})
    row["b_finished_at"] = now if outcome.finished_at is None else from_epoch(outcome.finished_at)
    return row


_RESULT_COLUMNS = [("id", pg_type(requests_t.c.id))] + [
    (name, pg_type(requests_t.c[name])) for name in RESULT_FIELDS
]
_RESULT_SOURCES = ", ".join(
    f"'{state}'" for state in lifecycle.values(lifecycle.common_sources(Cause.RESULT))
)


def results_document(rows: Sequence[Mapping[str, Any]], deliveries: Sequence[str] = ()) -> str:
    """The members' results (``result_row``s), and each one's webhook delivery id where given,
    as the one JSON array the result statements read (``_results_from``)."""
    document = [{name: row[f"b_{name}"] for name, _ in _RESULT_COLUMNS} for row in rows]
    for entry, delivery in zip(document, deliveries, strict=False):
        entry["delivery"] = delivery
    return rows_document(document)


def _results_from(rows_param: str, *extra: tuple[str, str]) -> str:
    """The rows of ``results_document`` (a parameter written as ``rows_param``), typed."""
    return rows_from(rows_param, [*_RESULT_COLUMNS, *extra], "v")


_WRITE_OUTCOMES_PG = text(
    "UPDATE requests AS r SET "
    + ", ".join(f"{name} = v.{name}" for name, _ in _RESULT_COLUMNS[1:])
    + " FROM "
    + _results_from(":rows")
    + " WHERE r.id = v.id AND r.batch_id = :batch_id AND r.state IN ("
    + _RESULT_SOURCES
    + ")"
    " RETURNING " + ", ".join(f"r.{column.name}" for column in RECORD_COLUMNS)
)


def _claimed(row: Mapping[Any, Any]) -> ClaimedRequest:
    return ClaimedRequest(
        id=str(row["id"]),
        input=row["input"],
        messages=row["messages"],
        params=row["params"],
        created_at=epoch(row["created_at"]),
    )


_CLAIMED_FIELDS = ", ".join(f.name for f in fields(ClaimedRequest))


def _claimed_pg(batch: str, guard: str = "") -> str:
    """The requests of ``ids`` still queued move to running under ``batch`` (a parameter),
    where ``guard`` holds too; what a worker runs of each comes back."""
    return (
        "UPDATE requests SET state = '"
        + S.RUNNING.value
        + f"', batch_id = %({batch})s, attempts = attempts + 1"
        " WHERE id = ANY(%(ids)s) AND model = %(model)s"
        + guard
        + " AND state IN ("
        + ", ".join(
            f"'{state}'" for state in lifecycle.values(lifecycle.sources(Cause.CLAIM, S.RUNNING))
        )
        + ") RETURNING "
        + _CLAIMED_FIELDS
    )


# The claim on Postgres, for the statements pool: the requests still queued move to running
# under the batch, whose row is written in the same statement when any did.
_CLAIM_PG = (
    "WITH claimed AS ("
    + _claimed_pg("id")
    + "), batch AS (INSERT INTO batches (id, model, size, attempt, isolation_group,"
    " estimated_ms, dispatched_at, lease_expires_at)"
    " SELECT %(id)s, %(model)s, count(*), 0, %(isolation_group)s, %(estimated_ms)s,"
    " %(dispatched_at)s, %(lease_expires_at)s FROM claimed HAVING count(*) > 0)"
    " SELECT " + _CLAIMED_FIELDS + " FROM claimed"
)
# join_batch on Postgres, for the statements pool: the batch row locked while this attempt
# holds it open, the joiners claimed under it, its size grown by them; one statement.
_JOIN_PG = (
    "WITH held AS (SELECT id FROM batches WHERE id = %(batch)s AND outcome IS NULL"
    " AND attempt = %(attempt)s FOR UPDATE),"
    " claimed AS ("
    + _claimed_pg("batch", " AND EXISTS (SELECT 1 FROM held)")
    + "), grown AS (UPDATE batches SET size = size + (SELECT count(*) FROM claimed)"
    " WHERE id IN (SELECT id FROM held))"
    " SELECT " + _CLAIMED_FIELDS + " FROM claimed"
)
# The lease on Postgres (``_START``'s statement), for the statements pool.
_START_PG = (
    "WITH started AS (UPDATE batches SET attempt = attempt + 1, worker = %(by)s,"
    " started_at = COALESCE(started_at, %(now)s), lease_expires_at = %(until)s"
    " WHERE id = %(batch)s AND outcome IS NULL AND (attempt = 0 OR lease_expires_at < %(now)s)"
    " RETURNING attempt, isolation_group)"
    " SELECT attempt, isolation_group, (SELECT array_agg(id) FROM requests"
    " WHERE batch_id = %(batch)s AND state = '" + S.RUNNING.value + "') AS live FROM started"
)


# complete_batch on Postgres, for the statements pool: the batch closes (fenced by its
# attempt), then its members still running take their results, each such transition is logged
# and each member with a webhook URL gets its delivery queued (ids minted by the caller, one a
# member), all in one statement; a row for the closed batch (NULL id when no member was still
# running) joined to each member written, no row when the attempt is stale. The members are
# written only once the batch row is locked and closed (their filter reads ``closed``).
_COMPLETE_PG = (
    "WITH closed AS (UPDATE batches SET outcome = %(batch_outcome)s, finished_at = %(now)s,"
    " model_ms = %(batch_model_ms)s, prompt_tokens = %(batch_prompt_tokens)s,"
    " max_new_tokens = %(batch_max_new_tokens)s,"
    " generated_tokens = %(batch_generated_tokens)s"
    " WHERE id = %(batch_id)s AND outcome IS NULL AND attempt = %(attempt)s RETURNING id),"
    " v AS (SELECT * FROM " + _results_from("%(rows)s", ("delivery", "text")) + "),"
    " written AS (UPDATE requests AS r SET "
    + ", ".join(f"{name} = v.{name}" for name, _ in _RESULT_COLUMNS[1:])
    + " FROM v WHERE r.id = v.id AND r.batch_id = %(batch_id)s AND r.state IN ("
    + _RESULT_SOURCES
    + ") AND EXISTS (SELECT 1 FROM closed)"
    " RETURNING " + ", ".join(f"r.{column.name}" for column in RECORD_COLUMNS) + ", v.delivery),"
    " logged AS (INSERT INTO request_events (request_id, state, batch_id, at)"
    " SELECT id, state, %(batch_id)s, %(now)s FROM written),"
    " queued AS (INSERT INTO webhook_deliveries (id, request_id, tenant, url, event_type,"
    " status, attempts, run_attempts, next_attempt_at, created_at)"
    " SELECT delivery, id, tenant, webhook_url, 'request.' || state, '"
    + DeliveryStatus.PENDING.value
    + "', 0, 0, %(now)s, %(now)s FROM written WHERE webhook_url IS NOT NULL)"
    " SELECT written.* FROM closed LEFT JOIN written ON true"
)


def _worker_started_later() -> Any:
    """For an UPDATE of ``batches``: its worker has started another batch since this one."""
    later = batches_t.alias("later")
    return (
        select(literal(1))
        .where(later.c.worker == batches_t.c.worker, later.c.started_at > batches_t.c.started_at)
        .exists()
    )
