"""The job store's state changes, on real Postgres and on the embedded SQLite file."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, insert, select, text, update

from batchserve.core.broker import MemoryRequestQueue
from batchserve.core.db import Statements, create_engine
from batchserve.core.domain import (
    BatchOutcome,
    ItemResult,
    Lane,
    RequestState,
    StateChange,
    SubmitCommand,
    Timings,
    decode_event,
    encode_event,
    from_epoch,
    utcnow,
)
from batchserve.core.errors import IdempotencyConflict, IdempotencyInProgress, InvalidTransition
from batchserve.core.events import MemoryEventBus
from batchserve.core.ids import uuid7
from batchserve.core.migrate import upgrade
from batchserve.core.records import COMMAND_COLUMNS, aware, command_row
from batchserve.core.store import (
    Admission,
    BatchStart,
    ClaimedRequest,
    Due,
    ItemOutcome,
    JobStore,
    Reaped,
    advisory_key,
)
from batchserve.core.store.base import NOTIFIED_OUTPUT_MAX_CHARS
from batchserve.core.tables import jobs_table, requests_table
from batchserve.workers.maintenance import Maintenance

S = RequestState
TIMINGS = Timings(1.0, 1.0, 100.0, 102.0)
EPOCH = from_epoch(0.0)


@pytest.fixture(params=["postgres", "postgres+statements", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    """Postgres through SQLAlchemy alone, and as the roles use it (``wiring.connect``): its hot
    single statements through psycopg's pool; and SQLite."""
    if request.param.startswith("postgres"):
        url = request.getfixturevalue("database_url")
    else:
        url = f"sqlite+aiosqlite:///{tmp_path}/store.sqlite3"
        upgrade(url)
    engine = create_engine(url, pool_size=4)
    statements = Statements(url, size=2) if request.param == "postgres+statements" else None
    yield JobStore(engine, max_failures=3, statements=statements)
    if statements is not None:
        await statements.close()
    await engine.dispose()


def command(
    text: str = "hi", *, key: str | None = None, fp: str | None = None, timeout_s: float = 600
) -> SubmitCommand:
    now = utcnow()
    return SubmitCommand(
        id=uuid7(),
        tenant="t1",
        model="echo-100ms",
        lane=Lane.INTERACTIVE,
        input=text,
        messages=None,
        params={"max_tokens": 16},
        created_at=now,
        deadline=now + timedelta(seconds=timeout_s),
        prompt_tokens=1,
        max_tokens=16,
        idempotency_key=key,
        fingerprint=fp or (text if key else None),
    )


async def submit(store: JobStore, *commands: SubmitCommand) -> list[str]:
    outcomes = await store.submit(list(commands))
    assert all(isinstance(o, Admission) for o in outcomes)
    return [str(o.record.id) for o in outcomes if isinstance(o, Admission)]


async def claim(store: JobStore, ids: list[str], now: float | None = None) -> uuid.UUID:
    batch_id = uuid7()
    assert await claim_as(store, batch_id, ids, now or time.time())
    return batch_id


def rows_of(database_url: str, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        return conn.execute(sql, params).fetchall()


async def claim_as(
    store: JobStore,
    batch_id: uuid.UUID,
    ids: list[str],
    now: float,
    estimated_s: float = 0.1,
    group: str | None = None,
) -> list[ClaimedRequest]:
    return await store.claim_batch(
        batch_id=batch_id,
        model="echo-100ms",
        request_ids=ids,
        now=now,
        estimated_s=estimated_s,
        lease_until=now + 5,
        isolation_group=group,
    )


def ok(request_id: str, text: str = "out") -> ItemOutcome:
    return ItemOutcome(
        ItemResult(request_id=request_id, output=text, finish_reason="stop"), TIMINGS
    )


async def test_submit_then_read_and_list(store: JobStore) -> None:
    ids = await submit(store, command("a"), command("b"), command("c"))
    record = await store.get(uuid.UUID(ids[0]), "t1")
    assert record is not None and record.state is S.QUEUED
    assert await store.get(uuid.UUID(ids[0]), "someone-else") is None
    first = await store.list_requests("t1", limit=2)
    assert [str(r.id) for r in first] == [ids[2], ids[1]]
    rest = await store.list_requests("t1", limit=2, before=first[-1].id)
    assert [str(r.id) for r in rest] == [ids[0]]


def awkward(name: str, *, key: str | None = None) -> SubmitCommand:
    """A command whose every column holds something a careless encoding would change."""
    base = command(name, key=key)
    return dataclasses.replace(
        base,
        input=f'{name}: "quoted" \\ back\\slash {{braces}} [1,2] tab\there\nnew line 😀 é \u2028',
        params={
            "max_tokens": 16,
            "temperature": 0.1,
            "top_p": 1e-07,
            "seed": 2**53 - 1,
            "stop": ["\n", '"', "\\"],
            "nested": {"null": None, "list": [1.5, -0.0, True]},
        },
        metadata={"key with space": 'v"al\\ue', "ünï": "😀"},
        webhook_url="https://example.com/h?a=1&b=%20",
        created_at=base.created_at.replace(microsecond=123_456),
        deadline=base.deadline.replace(microsecond=999_999),
        prompt_tokens=2**31 - 1,
        custom_id="line-1 'x'",
        job_line=7,
        fingerprint="f" * 64,
    )


async def test_admission_stores_every_field_as_given(store: JobStore) -> None:
    """One command and a group, with and without Idempotency-Keys: what a read finds is the
    record admission answered with, field for field (the rows travel as one JSON document)."""
    chat = dataclasses.replace(
        awkward("chat"), input=None, messages=[{"role": "user", "content": 'a "b" \\ c'}]
    )
    groups = [
        [awkward("one")],
        [awkward("a"), chat, awkward("c")],
        [awkward("keyed", key="k-1"), awkward("plain")],
    ]
    for group in groups:
        outcomes = await store.submit(group)
        assert len(outcomes) == len(group)
        for sent, outcome in zip(group, outcomes, strict=True):
            assert isinstance(outcome, Admission) and not outcome.replayed
            assert await store.get(sent.id, "t1") == outcome.record
            async with store.engine.connect() as conn:
                result = await conn.execute(
                    select(*[requests_table.c[name] for name in COMMAND_COLUMNS]).where(
                        requests_table.c.id == sent.id
                    )
                )
                stored = dict(result.one()._mapping)
            for name, value in command_row(sent).items():
                assert (
                    aware(stored[name]) if name in ("created_at", "deadline") else stored[name]
                ) == value, name


async def test_the_statement_pool_writes_and_reads_what_the_engine_does(database_url: str) -> None:
    """Admission and reads through psycopg's pool (one row, several rows) against the same
    through SQLAlchemy: the same rows, read back as the same records, finished ones included."""
    engine = create_engine(database_url, pool_size=2)
    statements = Statements(database_url, size=2)
    fast, plain = JobStore(engine, statements=statements), JobStore(engine)
    try:
        one = command("one")
        one = dataclasses.replace(one, metadata={"k": "v"}, webhook_url="https://example.com/h")
        group = [command("a"), command("b"), command("c")]
        messages = dataclasses.replace(
            command("m"), input=None, messages=[{"role": "user", "content": "hé"}]
        )
        ids = await submit(fast, one) + await submit(fast, *group) + await submit(plain, messages)
        await finish(plain, ids[:2])
        for request_id in ids:
            through_pool = await fast.get(uuid.UUID(request_id), "t1")
            assert through_pool is not None
            assert through_pool == await plain.get(uuid.UUID(request_id), "t1")
            assert await fast.get(uuid.UUID(request_id)) == through_pool
            assert await fast.get(uuid.UUID(request_id), "t2") is None
        done = await fast.get(uuid.UUID(ids[0]))
        assert done is not None and done.state is S.SUCCEEDED and done.timings == TIMINGS
        assert done.metadata == {"k": "v"} and done.webhook_url == "https://example.com/h"
        assert await fast.get(uuid7()) is None
        # A second admission of the same id is refused by the table, as through the engine.
        with pytest.raises(psycopg.errors.UniqueViolation):
            await fast.submit([one])
    finally:
        await statements.close()
        await engine.dispose()


async def test_the_statement_pool_claims_and_leases_as_the_engine_does(database_url: str) -> None:
    """The batch's claim and its lease, one statement each through psycopg's pool, against the
    same through SQLAlchemy: the same members handed over, the same rows written, the same
    start; a request no longer queued is left alone, and a claim of none writes no batch."""
    engine = create_engine(database_url, pool_size=2)
    statements = Statements(database_url, size=2)
    fast, plain = JobStore(engine, statements=statements), JobStore(engine)

    async def claim_and_start(store: JobStore, tag: str) -> tuple[list[Any], Any, Any, Any]:
        messages = dataclasses.replace(
            command(f"{tag} m"), input=None, messages=[{"role": "user", "content": "hé"}]
        )
        ids = await submit(store, command(f"{tag} a"), messages, command(f"{tag} c"))
        await store.cancel(uuid.UUID(ids[2]), "t1")
        batch_id, now = uuid7(), time.time()
        claimed = await claim_as(store, batch_id, ids, now, estimated_s=0.25, group="g1")
        claimed.sort(key=lambda c: ids.index(c.id))  # in no order of the claim's own
        assert [c.id for c in claimed] == ids[:2]
        # Nothing queued any more: no second batch.
        assert await claim_as(store, uuid7(), ids, now) == []
        start = await store.start_batch(batch_id, "w1", now, 2.0)
        assert start is not None and not isinstance(start, Reaped)
        assert start.live_ids == frozenset(ids[:2]) and start.isolating
        assert await store.start_batch(batch_id, "w2", now, 2.0) is None  # held by w1
        batch = rows_of(
            database_url,
            "SELECT model, size, attempt, worker, isolation_group, estimated_ms,"
            " dispatched_at = %s, lease_expires_at > dispatched_at FROM batches WHERE id = %s",
            (from_epoch(now), batch_id),
        )
        rows = rows_of(
            database_url,
            "SELECT state, attempts, batch_id = %s FROM requests WHERE id = ANY(%s)"
            " ORDER BY created_at, id",
            (batch_id, [uuid.UUID(i) for i in ids]),
        )
        batches = rows_of(database_url, "SELECT count(*) FROM batches", ())
        shown = [dataclasses.replace(c, id="", created_at=0.0) for c in claimed]
        return shown, batch, rows, (start.attempt, batches)

    try:
        through_engine = await claim_and_start(plain, "engine")
        through_pool = await claim_and_start(fast, "pool")
        assert through_pool[0] == [
            dataclasses.replace(c, input=c.input and c.input.replace("engine", "pool"))
            for c in through_engine[0]
        ]
        assert (
            through_pool[1]
            == through_engine[1]
            == [("echo-100ms", 2, 1, "w1", "g1", 250.0, True, True)]
        )
        assert through_pool[2] == through_engine[2]
        assert through_pool[3][0] == through_engine[3][0] == 1
    finally:
        await statements.close()
        await engine.dispose()


async def test_the_statement_pool_writes_results_as_the_engine_does(database_url: str) -> None:
    """A batch's results through psycopg's pool (one statement) against the same through
    SQLAlchemy's transaction: the same batch row, records, logged transitions and queued
    webhook deliveries; a member cancelled meanwhile keeps its end, and a stale attempt
    writes nothing."""
    engine = create_engine(database_url, pool_size=2)
    statements = Statements(database_url, size=2)
    fast, plain = JobStore(engine, statements=statements), JobStore(engine)

    async def complete(store: JobStore, tag: str) -> tuple[Any, ...]:
        hooked = dataclasses.replace(command(f"{tag} h"), webhook_url="https://example.com/h")
        ids = await submit(store, command(f"{tag} a"), hooked, command(f"{tag} c"))
        batch_id, now = await claim(store, ids), time.time()
        start = await store.start_batch(batch_id, "w1", now, 2.0)
        assert start is not None and not isinstance(start, Reaped)
        await store.cancel(uuid.UUID(ids[2]), "t1")
        outcomes = [
            ok(ids[0], f"{tag} out"),
            ItemOutcome(
                ItemResult(request_id=ids[1], error_code="model_error", error_message="boom"),
                TIMINGS,
            ),
            ok(ids[2]),
        ]
        figures: dict[str, Any] = {"model_ms": 100.0, "prompt_tokens": 7, "max_new_tokens": 16}
        stale = await store.complete_batch(
            batch_id, attempt=2, outcomes=outcomes, now=now, generated_tokens=9, **figures
        )
        assert stale is None
        done = await store.complete_batch(
            batch_id, attempt=1, outcomes=outcomes, now=now, generated_tokens=9, **figures
        )
        assert done == Reaped()
        again = await store.complete_batch(
            batch_id, attempt=1, outcomes=outcomes, now=now, generated_tokens=9, **figures
        )
        assert again is None  # closed already: nothing is answered twice
        records = []
        for request_id in ids:
            record = await plain.get(uuid.UUID(request_id))
            assert record is not None
            if record.state is not S.CANCELLED:
                assert record.finished_at == from_epoch(now)
            records.append(
                dataclasses.replace(
                    record,
                    id=uuid.UUID(int=0),
                    created_at=EPOCH,
                    deadline=EPOCH,
                    finished_at=None,
                    batch_id=None,
                )
            )
        members = [uuid.UUID(i) for i in ids]
        batch = rows_of(
            database_url,
            "SELECT outcome, finished_at = %s, model_ms, prompt_tokens, max_new_tokens,"
            " generated_tokens FROM batches WHERE id = %s",
            (from_epoch(now), batch_id),
        )
        events = rows_of(
            database_url,
            "SELECT state, batch_id = %s, at = %s FROM request_events"
            " WHERE request_id = ANY(%s) ORDER BY state",
            (batch_id, from_epoch(now), members),
        )
        deliveries = rows_of(
            database_url,
            "SELECT request_id = %s, tenant, url, event_type, status, attempts, run_attempts,"
            " next_attempt_at = %s, id LIKE 'msg_%%' FROM webhook_deliveries"
            " WHERE request_id = ANY(%s)",
            (uuid.UUID(ids[1]), from_epoch(now), members),
        )
        return records, batch, events, deliveries

    try:
        through_engine = await complete(plain, "engine")
        through_pool = await complete(fast, "pool")
        assert through_pool[1:] == through_engine[1:]
        assert through_pool[1] == [("succeeded", True, 100.0, 7, 16, 9)]
        assert [state for state, *_ in through_pool[2]] == ["cancelled", "failed", "succeeded"]
        assert through_pool[3] == [
            (True, "t1", "https://example.com/h", "request.failed", "pending", 0, 0, True, True)
        ]
        engine_records, pool_records = through_engine[0], through_pool[0]
        assert [r.state for r in pool_records] == [S.SUCCEEDED, S.FAILED, S.CANCELLED]
        assert pool_records[0].output == "pool out" and engine_records[0].output == "engine out"
        assert pool_records[1:] == engine_records[1:]
        assert dataclasses.replace(pool_records[0], output=None) == dataclasses.replace(
            engine_records[0], output=None
        )
    finally:
        await statements.close()
        await engine.dispose()


@pytest.mark.parametrize(
    "path",
    ["one statement", "transaction", "early members", "sqlite", "sqlite, early members"],
)
async def test_the_results_notification_carries_each_request_as_a_read_finds_it(
    request: pytest.FixtureRequest, tmp_path: Path, path: str
) -> None:
    """On Postgres the statement that writes results returns its requests' rows, and the
    terminal notifications carry them (the long-polls answer from them, no read): equal to
    what a read returns, and on the wire too. So do a batch's results through the statements
    pool (one statement), through the engine (a transaction), and an engine model's sequences
    finishing before the rest of their batch; and on SQLite (the embedded mode), whose update
    returns nothing, the transaction reads the requests it wrote back once. A change with more
    output than one notification carries goes without: each waiter reads its own."""
    if path.startswith("sqlite"):
        url = f"sqlite+aiosqlite:///{tmp_path}/store.sqlite3"
        upgrade(url)
    else:
        url = request.getfixturevalue("database_url")
    engine = create_engine(url, pool_size=2)
    statements = Statements(url, size=2) if path == "one statement" else None
    heard: list[StateChange] = []

    async def on_change(change: StateChange) -> None:
        heard.append(change)

    store = JobStore(engine, statements=statements, on_change=on_change)

    async def complete(outcomes: list[ItemOutcome], ids: list[str]) -> None:
        batch_id, now = await claim(store, ids), time.time()
        start = await store.start_batch(batch_id, "w1", now, 2.0)
        assert start is not None and not isinstance(start, Reaped)
        heard.clear()
        if path.endswith("early members"):
            written = await store.complete_items(batch_id, attempt=1, outcomes=outcomes, now=now)
            assert written is not None and set(written) == set(ids)
            return
        done = await store.complete_batch(
            batch_id, attempt=1, outcomes=outcomes, now=now, model_ms=100.0
        )
        assert done is not None

    try:
        hooked = dataclasses.replace(
            command("b"), webhook_url="https://example.com/h", metadata={"k": "v"}
        )
        ids = await submit(store, command("a"), hooked)
        failed = ItemResult(request_id=ids[1], error_code="model_error", error_message="boom")
        await complete([ok(ids[0], "answer"), ItemOutcome(failed, TIMINGS)], ids)
        by_state = {change.state: change for change in heard if change.state.terminal}
        assert set(by_state) == {S.SUCCEEDED, S.FAILED}
        for change in by_state.values():
            assert [str(r.id) for r in change.records] == list(change.request_ids)
            decoded = decode_event(encode_event(change))
            assert isinstance(decoded, StateChange)
            assert decoded.records_for(change.request_ids) == dict(
                zip(change.request_ids, change.records, strict=True)
            )
            for record in change.records:
                assert record == await store.get(record.id)
        assert by_state[S.SUCCEEDED].records[0].output == "answer"
        assert by_state[S.FAILED].records[0].metadata == {"k": "v"}

        ids = await submit(store, command("c"), command("d"))
        long = "x" * (NOTIFIED_OUTPUT_MAX_CHARS // 2 + 1)
        await complete([ok(i, long) for i in ids], ids)
        ended = [c for c in heard if c.state.terminal]
        assert [(c.state, c.records) for c in ended] == [(S.SUCCEEDED, ())]
        assert set(ended[0].request_ids) == set(ids)
    finally:
        if statements is not None:
            await statements.close()
        await engine.dispose()


@pytest.mark.parametrize("path", ["one statement", "transaction", "early members"])
async def test_results_are_stored_as_the_model_made_them(database_url: str, path: str) -> None:
    """Outputs, errors, token counts and timings a careless encoding would change, written by
    each of the three result statements (the rows travel as one JSON document): a read finds
    each as it was given."""
    engine = create_engine(database_url, pool_size=2)
    statements = Statements(database_url, size=2) if path == "one statement" else None
    store = JobStore(engine, statements=statements)
    try:
        ids = await submit(store, command("a"), command("b"), command("c"))
        text_out = 'a "quoted" \\ back\\slash {x} [1] tab\there\nline 😀 é \u2028' * 50
        timings = Timings(0.1, 1e-07, 100.123456789, 102.5, ttft_ms=0.30000000000000004)
        given = [
            ItemResult(ids[0], output=text_out, finish_reason="length", prompt_tokens=2**31 - 1),
            ItemResult(ids[1], output="", finish_reason="stop", completion_tokens=0),
            ItemResult(ids[2], error_code="model_error", error_message='it said "no" \\ 😀'),
        ]
        batch_id, now = await claim(store, ids), time.time()
        start = await store.start_batch(batch_id, "w1", now, 2.0)
        assert start is not None and not isinstance(start, Reaped)
        outcomes = [ItemOutcome(result, timings) for result in given]
        if path == "early members":
            assert await store.complete_items(batch_id, attempt=1, outcomes=outcomes, now=now)
        else:
            done = await store.complete_batch(
                batch_id, attempt=1, outcomes=outcomes, now=now, model_ms=100.0
            )
            assert done is not None
        for result in given:
            found = await store.get(uuid.UUID(result.request_id))
            assert found is not None
            assert found.state is (S.SUCCEEDED if result.ok else S.FAILED)
            assert (found.output, found.finish_reason) == (result.output, result.finish_reason)
            assert (found.error_code, found.error_message) == (
                result.error_code,
                result.error_message,
            )
            assert (found.prompt_tokens, found.completion_tokens) == (
                result.prompt_tokens,
                result.completion_tokens,
            )
            assert found.timings == timings
            assert found.finished_at is not None
            assert abs(found.finished_at.timestamp() - now) < 1e-5
    finally:
        if statements is not None:
            await statements.close()
        await engine.dispose()


async def finish(store: JobStore, ids: list[str]) -> None:
    batch_id = await claim(store, ids)
    start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
    assert start is not None and not isinstance(start, Reaped)
    await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(i) for i in ids], now=time.time(), model_ms=100
    )


async def test_idempotency_replay_conflict_and_in_progress(store: JobStore) -> None:
    [original] = await submit(store, command("x", key="k1"))
    [replay] = await store.submit([command("x", key="k1")])
    assert isinstance(replay, Admission) and replay.replayed and str(replay.record.id) == original
    [conflict] = await store.submit([command("y", key="k1")])
    assert isinstance(conflict, IdempotencyConflict)
    first, twin = await store.submit([command("z", key="k2"), command("z", key="k2")])
    assert isinstance(first, Admission) and not first.replayed
    assert isinstance(twin, IdempotencyInProgress)


async def test_key_held_by_another_admission_answers_in_progress(database_url: str) -> None:
    engine = create_engine(database_url, pool_size=2)
    store = JobStore(engine)
    with psycopg.connect(database_url.replace("+psycopg", "")) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("t1", "busy"),))
        [outcome] = await store.submit([command("x", key="busy")])
        assert isinstance(outcome, IdempotencyInProgress)
    [outcome] = await store.submit([command("x", key="busy")])
    assert isinstance(outcome, Admission)
    await engine.dispose()


async def test_results_are_fenced_by_batch_and_attempt(store: JobStore) -> None:
    ids = await submit(store, command("a"), command("b"))
    batch_id = await claim(store, ids)
    start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
    assert start is not None and not isinstance(start, Reaped)
    assert start.attempt == 1 and start.live_ids == set(ids)
    stale = await store.complete_batch(
        batch_id, attempt=2, outcomes=[ok(i) for i in ids], now=time.time(), model_ms=100
    )
    assert stale is None
    done = await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(i) for i in ids], now=time.time(), model_ms=100
    )
    assert done is not None
    again = await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(i, "twice") for i in ids], now=time.time(), model_ms=100
    )
    assert again is None
    for i in ids:
        record = await store.get(uuid.UUID(i))
        assert record is not None and record.state is S.SUCCEEDED and record.output == "out"
    assert await store.start_batch(batch_id, "w2", time.time(), 2.0) is None  # a late duplicate


async def test_cancel_queued_never_runs_and_cancel_running_discards_result(store: JobStore) -> None:
    queued, running = await submit(store, command("q"), command("r"))
    cancelled = await store.cancel(uuid.UUID(queued), "t1")
    assert cancelled.state is S.CANCELLED
    batch_id = await claim(store, [running])
    assert (
        await store.claim_batch(
            batch_id=uuid7(),
            model="echo-100ms",
            request_ids=[queued],
            now=time.time(),
            estimated_s=0.1,
            lease_until=time.time() + 5,
        )
        == []
    )
    start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
    assert start is not None and not isinstance(start, Reaped)
    await store.cancel(uuid.UUID(running), "t1")
    await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(running)], now=time.time(), model_ms=100
    )
    record = await store.get(uuid.UUID(running))
    assert record is not None and record.state is S.CANCELLED and record.output is None
    with pytest.raises(InvalidTransition):
        [done] = await submit(store, command("d"))
        b = await claim(store, [done])
        await store.start_batch(b, "w1", time.time(), 2.0)
        await store.complete_batch(b, attempt=1, outcomes=[ok(done)], now=time.time(), model_ms=1)
        await store.cancel(uuid.UUID(done), "t1")


async def test_overdue_queued_requests_expire_without_running(store: JobStore) -> None:
    [short] = await submit(store, command("s", timeout_s=0.05))
    [long] = await submit(store, command("l"))
    expired = await store.expire_overdue(time.time() + 1)
    assert expired == [short]
    record = await store.get(uuid.UUID(short))
    assert (
        record is not None
        and record.state is S.EXPIRED
        and record.error_code == "deadline_exceeded"
    )
    assert (await store.get(uuid.UUID(long))).state is S.QUEUED  # type: ignore[union-attr]


async def test_due_names_the_tasks_with_work_and_nothing_when_idle(store: JobStore) -> None:
    now = time.time()
    assert not await store.due(now, unpublished_before=now)
    [short] = await submit(store, command("s", timeout_s=0.05))
    [leased] = await submit(store, command("l"))
    await store.mark_published([leased])
    # Within its deadline, published or recent: nothing yet.
    assert await store.due(now, unpublished_before=now - 60) == Due()
    assert await store.due(now + 1, unpublished_before=now + 1) == Due(
        overdue=True, unpublished=True
    )
    batch_id = await claim(store, [leased], now)
    await store.start_batch(batch_id, "w1", now, 0.5)
    assert (await store.due(now + 0.1, unpublished_before=now - 60)).leases is False
    assert await store.due(now + 1, unpublished_before=now - 60) == Due(leases=True, overdue=True)
    # What the probes say is what the verbs find.
    assert [lease.batch_id for lease in await store.expired_leases(now + 1)] == [batch_id]
    assert await store.expire_overdue(now + 1) == [short]
    assert [m.id for m in await store.unpublished(now + 1)] == []
    assert (await store.due(now + 1, unpublished_before=now + 1)).leases is True
    await store.reap_batch(batch_id, now=now + 1, outcome=BatchOutcome.CRASHED)
    assert not await store.due(now + 1, unpublished_before=now - 60)


async def test_an_idle_maintenance_tick_is_one_statement(store: JobStore) -> None:
    """Each of maintenance's tasks used to cost a transaction a tick, work or not."""
    statements: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.startswith("BEGIN"):  # SQLite's write lock (core/db.py), no statement
            statements.append(statement)

    maintenance = Maintenance(store=store, queue=MemoryRequestQueue(), events=MemoryEventBus())
    event.listen(store.engine.sync_engine, "before_cursor_execute", seen)
    try:
        report = await maintenance.tick(time.time() + maintenance.config.prune_every_s)
        assert report.pruned == 0  # the hourly prune ran in the first tick: a few statements
        statements.clear()
        for _ in range(3):
            await maintenance.tick(time.time() + maintenance.config.prune_every_s)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", seen)
    assert len(statements) == 3, statements


async def test_crashed_batch_requeues_members_in_halves(store: JobStore) -> None:
    ids = await submit(store, *(command(f"r{i}") for i in range(4)))
    batch_id = await claim(store, ids)
    await store.start_batch(batch_id, "w1", time.time(), 0.01)
    reaped = await store.reap_batch(batch_id, now=time.time() + 1, outcome=BatchOutcome.CRASHED)
    groups: dict[str | None, list[str]] = {}
    for m in reaped.requeued:
        groups.setdefault(m.group, []).append(m.id)
    assert sorted(len(g) for g in groups.values()) == [2, 2]
    assert all(g is not None and g.startswith(str(batch_id)) for g in groups)
    for i in ids:
        assert (await store.get(uuid.UUID(i))).state is S.QUEUED  # type: ignore[union-attr]


async def test_lone_crasher_is_charged_until_it_fails_as_poison(store: JobStore) -> None:
    [culprit] = await submit(store, command("boom"))
    for attempt in range(1, 4):
        batch_id = await claim(store, [culprit])
        await store.start_batch(batch_id, "w1", time.time(), 0.01)
        reaped = await store.reap_batch(batch_id, now=time.time() + 1, outcome=BatchOutcome.CRASHED)
        if attempt < 3:
            assert [m.group for m in reaped.requeued] == [f"solo:{culprit}"]
        else:
            assert reaped.failed == (culprit,)
    record = await store.get(uuid.UUID(culprit))
    assert record is not None and record.state is S.FAILED and record.error_code == "poison"


async def test_a_batch_its_worker_moved_on_from_is_no_crash_suspect(store: JobStore) -> None:
    """A worker runs one model at a time: once it started a later batch, an earlier one still
    open was only being written when the process died. Its members go back whole, uncharged;
    the later batch's members are the suspects, in halves."""
    earlier_ids = await submit(store, command("e1"), command("e2"))
    later_ids = await submit(store, command("l1"), command("l2"))
    other_ids = await submit(store, command("o1"), command("o2"))
    earlier = await claim(store, earlier_ids)
    later = await claim(store, later_ids)
    other = await claim(store, other_ids)
    now = time.time()
    await store.start_batch(earlier, "w1", now, 0.01)
    await store.start_batch(other, "w2", now + 0.001, 0.01)  # another worker's start proves nothing
    await store.start_batch(later, "w1", now + 0.002, 0.01)
    reaped = {
        batch: await store.reap_batch(batch, now=now + 1, outcome=BatchOutcome.CRASHED)
        for batch in (earlier, later)
    }
    assert {m.group for m in reaped[earlier].requeued} == {None}
    assert len({m.group for m in reaped[later].requeued}) == 2  # halves
    other_reaped = await store.reap_batch(other, now=now + 1, outcome=BatchOutcome.CRASHED)
    assert len({m.group for m in other_reaped.requeued}) == 2
    for i in earlier_ids:
        record = await store.get(uuid.UUID(i))
        assert record is not None and record.state is S.QUEUED


async def test_restart_of_a_dead_workers_batch_is_reaped_not_rerun(store: JobStore) -> None:
    ids = await submit(store, command("a"), command("b"))
    batch_id = await claim(store, ids)
    await store.start_batch(batch_id, "w1", time.time(), 0.01)
    again = await store.start_batch(batch_id, "w2", time.time() + 1, 2.0)
    assert isinstance(again, Reaped) and len(again.requeued) == 2


async def test_finished_requests_are_pruned_with_their_events_and_settled_deliveries(
    store: JobStore,
) -> None:
    hooked = dataclasses.replace(command("hooked"), webhook_url="https://example.com/h")
    done, hooked_id, cancelled, waiting = await submit(
        store, command("done"), hooked, command("cancelled"), command("waiting")
    )
    await finish(store, [done, hooked_id])
    await store.cancel(uuid.UUID(cancelled), "t1")

    async def count(sql: str) -> int:
        async with store.engine.connect() as conn:
            return int((await conn.execute(text(sql))).scalar_one())

    assert await count("SELECT count(*) FROM request_events") == 3
    assert await count("SELECT count(*) FROM webhook_deliveries") == 1
    # Nothing finished before an hour ago.
    assert await store.prune_finished(time.time() - 3600) == 0
    # Finished before the cutoff: the two without a pending delivery, one at a time.
    later = time.time() + 1
    assert await store.prune_finished(later, limit=1) == 1
    assert await store.prune_finished(later) == 1
    assert await store.prune_finished(later) == 0
    for gone in (done, cancelled):
        assert await store.get(uuid.UUID(gone), "t1") is None
    # The one whose webhook is still pending stays, and the unfinished one.
    assert (await store.get(uuid.UUID(waiting), "t1")) is not None
    assert (await store.get(uuid.UUID(hooked_id), "t1")) is not None
    assert await count("SELECT count(*) FROM request_events") == 1
    async with store.engine.begin() as conn:
        await conn.execute(text("UPDATE webhook_deliveries SET status = 'delivered'"))
    assert await store.prune_finished(later) == 1
    assert await store.get(uuid.UUID(hooked_id), "t1") is None
    assert await count("SELECT count(*) FROM request_events") == 0
    assert await count("SELECT count(*) FROM webhook_deliveries") == 0
    assert await count("SELECT count(*) FROM requests") == 1  # the one still queued


async def test_a_finished_request_of_a_running_batch_job_is_pruned_once_the_job_ends(
    store: JobStore,
) -> None:
    job_id, now = uuid7(), utcnow()
    async with store.engine.begin() as conn:
        await conn.execute(
            insert(jobs_table).values(
                id=job_id,
                tenant="t1",
                status="in_progress",
                endpoint="/v1/chat/completions",
                completion_window="24h",
                input_file_id=uuid7(),
                created_at=now,
                expires_at=now + timedelta(hours=24),
            )
        )
    (member,) = await submit(store, command("member"))
    await finish(store, [member])
    async with store.engine.begin() as conn:
        await conn.execute(
            update(requests_table)
            .where(requests_table.c.id == uuid.UUID(member))
            .values(job_id=job_id)
        )
    later = time.time() + 1
    assert await store.prune_finished(later) == 0  # its job still writes its output from it
    async with store.engine.begin() as conn:
        await conn.execute(update(jobs_table).values(status="completed"))
    assert await store.prune_finished(later) == 1


async def test_committed_but_unpublished_requests_are_found(store: JobStore) -> None:
    published, lost = await submit(store, command("p"), command("l"))
    await store.mark_published([published])
    found = await store.unpublished(time.time() + 1)
    assert [m.id for m in found] == [lost]


async def test_groups_marked_published_together_keep_their_own_times(store: JobStore) -> None:
    first, second, never = await submit(store, command("1"), command("2"), command("n"))
    await store.mark_published_groups([([first], 1_000_000.0), ([second], 2_000_000.0)])
    await store.mark_published_groups([([first], 3_000_000.0)])  # marked already: kept
    assert await published_times(store) == {first: 1_000_000.0, second: 2_000_000.0, never: None}


async def test_only_requests_still_queued_are_marked_published(store: JobStore) -> None:
    """A claimed request needs no mark (maintenance republishes only queued ones, and a requeue
    clears the mark), so marking it would be a write for nothing."""
    claimed, queued = await submit(store, command("c"), command("q"))
    await claim(store, [claimed])
    await store.mark_published_groups([([claimed, queued], 1_000_000.0)])
    assert await published_times(store) == {claimed: None, queued: 1_000_000.0}


async def published_times(store: JobStore) -> dict[str, float | None]:
    """Each request's ``published_at`` (epoch seconds; None while unmarked)."""
    from sqlalchemy import select

    async with store.engine.connect() as conn:
        rows = await conn.execute(select(requests_table.c.id, requests_table.c.published_at))
        return {str(i): at.timestamp() if at else None for i, at in rows}


async def test_marking_published_skips_a_row_another_transaction_holds(database_url: str) -> None:
    """A claim or a result write holding a row must not make the mark wait: waiting on rows
    they lock in another order was a deadlock (seen in the rolling-restart chaos test)."""
    engine = create_engine(database_url, pool_size=2)
    store = JobStore(engine)
    held, free = await submit(store, command("held"), command("free"))
    with psycopg.connect(database_url.replace("+psycopg", "")) as other:
        other.execute("SELECT id FROM requests WHERE id = %s FOR UPDATE", (uuid.UUID(held),))
        await asyncio.wait_for(store.mark_published([held, free]), timeout=5.0)
    unmarked = {m.id for m in await store.unpublished(time.time() + 1)}
    assert unmarked == {held}  # the held row stays for maintenance to publish again
    await engine.dispose()


async def terminal_events(store: JobStore) -> dict[str, list[str]]:
    from sqlalchemy import select

    from batchserve.core.tables import events_table

    async with store.engine.connect() as conn:
        rows = (await conn.execute(select(events_table.c.request_id, events_table.c.state))).all()
    events: dict[str, list[str]] = {}
    for request_id, state in rows:
        events.setdefault(str(request_id), []).append(state)
    return events


async def test_every_terminal_transition_is_logged_once(store: JobStore) -> None:
    done, cancelled, expired, late = await submit(
        store, command("d"), command("c"), command("e", timeout_s=0.01), command("l")
    )
    batch_id = await claim(store, [done, late])
    await store.start_batch(batch_id, "w1", time.time(), 2.0)
    await store.cancel(uuid.UUID(cancelled), "t1")
    await store.cancel(uuid.UUID(cancelled), "t1")  # idempotent: no second transition
    await store.cancel(uuid.UUID(late), "t1")  # running: its result will be discarded
    await store.expire_overdue(time.time() + 1)
    await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(done), ok(late)], now=time.time(), model_ms=1
    )
    await store.complete_batch(
        batch_id, attempt=1, outcomes=[ok(done)], now=time.time(), model_ms=1
    )
    events = await terminal_events(store)
    assert events == {
        done: ["succeeded"],
        cancelled: ["cancelled"],
        expired: ["expired"],
        late: ["cancelled"],
    }


async def test_late_joiners_are_claimed_only_into_an_open_batch_this_attempt_holds(
    store: JobStore,
) -> None:
    """``join_batch``: queued joiners move to running under the batch, its size grows, the
    claimed inputs come back; a cancelled one, a wrong attempt or a closed batch claim none."""
    first = await submit(store, command("a"))
    batch_id = await claim(store, first)
    start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
    assert isinstance(start, BatchStart) and start.attempt == 1
    joiners = await submit(store, command("b"), command("c"), command("d"))
    await store.cancel(uuid.UUID(joiners[2]), tenant="t1")

    stale = await store.join_batch(batch_id, attempt=2, model="echo-100ms", request_ids=joiners)
    assert stale == []
    claimed = await store.join_batch(batch_id, attempt=1, model="echo-100ms", request_ids=joiners)
    assert sorted(c.id for c in claimed) == sorted(joiners[:2])
    assert {c.input for c in claimed} == {"b", "c"}
    states = await store.states_of(joiners)
    assert states == {joiners[0]: S.RUNNING, joiners[1]: S.RUNNING, joiners[2]: S.CANCELLED}
    placed = await store.placements_of([*joiners, str(uuid.uuid4())])  # an unknown id: left out
    assert placed == {
        joiners[0]: (S.RUNNING, batch_id),
        joiners[1]: (S.RUNNING, batch_id),
        joiners[2]: (S.CANCELLED, None),
    }
    assert sorted(c.id for c in await store.joined_members(batch_id, joiners)) == sorted(
        joiners[:2]
    )
    # Claimed once: a second join of the same ids finds nothing queued.
    assert (
        await store.join_batch(batch_id, attempt=1, model="echo-100ms", request_ids=joiners) == []
    )

    outcomes = [
        ItemOutcome(ItemResult(r, output="x", finish_reason="stop"), TIMINGS)
        for r in [*first, *joiners[:2]]
    ]
    reaped = await store.complete_batch(
        batch_id, attempt=1, outcomes=outcomes, now=time.time(), model_ms=100.0
    )
    assert reaped is not None
    assert set((await store.states_of([*first, *joiners[:2]])).values()) == {S.SUCCEEDED}
    finished = [b for b in await store.finished_batches("echo-100ms") if b.id == batch_id]
    assert [b.size for b in finished] == [3]
    # A closed batch takes nobody.
    later = await submit(store, command("e"))
    assert await store.join_batch(batch_id, attempt=1, model="echo-100ms", request_ids=later) == []
    assert (await store.states_of(later))[later[0]] is S.QUEUED


async def test_late_joiners_of_a_batch_whose_worker_died_are_requeued_with_it(
    store: JobStore,
) -> None:
    """A worker that claimed late joiners and died: the reap sends them back with the batch's
    own members (each once), as suspects of the crash like them."""
    first = await submit(store, command("a"), command("b"))
    batch_id = await claim(store, first)
    start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
    assert isinstance(start, BatchStart)
    joiners = await submit(store, command("c"), command("d"))
    claimed = await store.join_batch(batch_id, attempt=1, model="echo-100ms", request_ids=joiners)
    assert len(claimed) == 2
    reaped = await store.reap_batch(batch_id, now=time.time(), outcome=BatchOutcome.CRASHED)
    assert sorted(m.id for m in reaped.requeued) == sorted([*first, *joiners])
    assert set((await store.states_of([*first, *joiners])).values()) == {S.QUEUED}
    assert len({m.group for m in reaped.requeued}) == 2  # in halves, joiners among them


async def test_lease_renewals_do_not_wait_for_postgres_to_flush(
    store: JobStore, request: pytest.FixtureRequest
) -> None:
    """A renewal commits without waiting for the WAL flush (``synchronous_commit`` off for its
    transaction alone), so a busy disk cannot hold it past the lease it extends; it still
    extends the lease."""
    from sqlalchemy import event

    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(store.engine.sync_engine, "before_cursor_execute", record)
    try:
        ids = await submit(store, command("a"))
        batch_id = await claim(store, ids)
        start = await store.start_batch(batch_id, "w1", time.time(), 2.0)
        assert isinstance(start, BatchStart)
        seen.clear()
        assert await store.renew_lease(batch_id, "w1", 1, time.time() + 30.0)
        assert await store.renew_leases([(batch_id, "w1")], time.time() + 60.0) == {batch_id}
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", record)
    renewals = [s for s in seen if s.startswith("UPDATE batches")]
    asynchronous = [s for s in seen if s == "SET LOCAL synchronous_commit = off"]
    assert len(renewals) == 2
    postgres = "postgres" in request.node.callspec.params["store"]
    assert len(asynchronous) == (2 if postgres else 0)
    if postgres:  # each right before its renewal
        assert [seen.index(a) + 1 for a in asynchronous[:1]] == [seen.index(renewals[0])]
    expired = await store.expired_leases(time.time() + 50.0)
    assert batch_id not in {e.batch_id for e in expired}  # held until +60 s


async def test_a_lease_gone_with_its_own_results_is_told_from_one_reaped(store: JobStore) -> None:
    """A renewal that runs just after its attempt's results were written finds the lease gone
    as it would after a reap: ``ended_by`` tells the two apart (the worker warns of the
    second alone)."""
    ids = await submit(store, command("a"))
    written = await claim(store, ids)
    assert isinstance(await store.start_batch(written, "w1", time.time(), 2.0), BatchStart)
    assert not await store.ended_by(written, 1)  # still running
    done = await store.complete_batch(
        written, attempt=1, outcomes=[ok(ids[0])], now=time.time(), model_ms=100.0
    )
    assert done == Reaped()
    assert not await store.renew_lease(written, "w1", 1, time.time() + 30.0)
    assert await store.ended_by(written, 1) and not await store.ended_by(written, 2)

    ids = await submit(store, command("b"))
    reaped = await claim(store, ids)
    assert isinstance(await store.start_batch(reaped, "w1", time.time(), 2.0), BatchStart)
    await store.reap_batch(reaped, now=time.time(), outcome=BatchOutcome.CRASHED)
    assert not await store.renew_lease(reaped, "w1", 1, time.time() + 30.0)
    assert not await store.ended_by(reaped, 1)
