"""The request lifecycle table, and the job store making only the moves it lists."""

from __future__ import annotations

import uuid
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from batchserve.core import lifecycle
from batchserve.core.domain import (
    TERMINAL_STATES,
    BatchOutcome,
    ItemResult,
    RequestState,
    Timings,
)
from batchserve.core.ids import uuid7
from batchserve.core.lifecycle import TRANSITIONS, Cause
from batchserve.core.store import ItemOutcome, JobStore
from batchserve.core.store.base import events_t, moving
from batchserve.core.tables import REQUEST_STATES
from tests.support.stepped import command, sqlite_store

S = RequestState
NOW = 1_000_000.0
SHORT = (("late", 1.0), ("short", 5.0))  # timeouts (s): expired queued, and when reaped


def _reachable(start: RequestState) -> set[RequestState]:
    seen, todo = {start}, deque([start])
    while todo:
        state = todo.popleft()
        for t in TRANSITIONS:
            if t.source is state and t.target not in seen:
                seen.add(t.target)
                todo.append(t.target)
    return seen


def test_terminal_states_have_no_way_out_and_open_ones_have_one() -> None:
    assert lifecycle.TERMINAL == TERMINAL_STATES
    assert {s for s in RequestState if s.terminal} == lifecycle.TERMINAL
    leaving = {t.source for t in TRANSITIONS}
    assert leaving.isdisjoint(lifecycle.TERMINAL)
    assert leaving == lifecycle.OPEN == {S.QUEUED, S.RUNNING}


def test_every_state_is_reachable_from_queued_and_every_request_can_end() -> None:
    assert lifecycle.INITIAL_STATE is S.QUEUED
    assert _reachable(S.QUEUED) == set(RequestState)
    for state in lifecycle.OPEN:
        assert _reachable(state) & lifecycle.TERMINAL == lifecycle.TERMINAL


def test_transitions_are_distinct_moves_between_stored_states() -> None:
    moves = [(t.source, t.target, t.cause) for t in TRANSITIONS]
    assert len(moves) == len(set(moves))
    assert all(t.source is not t.target and t.actor for t in TRANSITIONS)
    assert {c for _, _, c in moves} == set(Cause)
    # The table's CHECK constraint admits exactly the lifecycle's states.
    assert ",".join(f"'{s.value}'" for s in RequestState) == REQUEST_STATES


def test_sources_and_targets_are_read_from_the_table() -> None:
    assert lifecycle.sources(Cause.CANCEL, S.CANCELLED) == (S.QUEUED, S.RUNNING)
    assert lifecycle.sources(Cause.CLAIM, S.RUNNING) == (S.QUEUED,)
    assert lifecycle.targets(Cause.RESULT) == (S.SUCCEEDED, S.FAILED)
    assert lifecycle.common_sources(Cause.RESULT) == (S.RUNNING,)
    assert lifecycle.allowed(S.RUNNING, S.QUEUED)
    assert not lifecycle.allowed(S.SUCCEEDED, S.QUEUED)
    with pytest.raises(ValueError):
        lifecycle.sources(Cause.CLAIM, S.SUCCEEDED)
    with pytest.raises(ValueError):
        lifecycle.sources(Cause.REQUEUE, S.FAILED)


def test_state_changing_statements_are_built_from_the_table() -> None:
    for t in TRANSITIONS:
        stmt = moving(t.cause, t.target)
        compiled = stmt.compile(compile_kwargs={"literal_binds": True})
        sql = str(compiled)
        allowed = lifecycle.sources(t.cause, t.target)
        for state in RequestState:
            assert (f"'{state.value}'" in sql.split("WHERE")[1]) == (state in allowed), sql
        assert f"state='{t.target.value}'" in sql.replace(" ", "")
    with pytest.raises(ValueError):
        moving(Cause.CLAIM, S.RUNNING, source=S.RUNNING)


async def _claim(store: JobStore, *ids: str) -> uuid.UUID:
    batch_id = uuid7()
    claimed = await store.claim_batch(
        batch_id=batch_id,
        model="m",
        request_ids=list(ids),
        now=NOW,
        estimated_s=1.0,
        lease_until=NOW + 30.0,
    )
    assert len(claimed) == len(ids)
    assert await store.start_batch(batch_id, f"w/{batch_id}", NOW, 30.0) is not None
    return batch_id


async def test_the_store_makes_only_the_moves_the_table_lists(tmp_path: Path) -> None:
    """Every verb that changes a request's state, run on the embedded store, which records
    each change of ``requests.state`` by a trigger: only listed moves are made, every listed
    move is made by some verb, and each ending is logged once."""
    store = sqlite_store(tmp_path, max_failures=1)
    async with store.engine.begin() as conn:
        await conn.exec_driver_sql("CREATE TABLE moves (request_id, source, target)")
        await conn.exec_driver_sql(
            "CREATE TRIGGER record_moves AFTER UPDATE OF state ON requests"
            " WHEN OLD.state IS NOT NEW.state BEGIN"
            " INSERT INTO moves VALUES (NEW.id, OLD.state, NEW.state); END"
        )
    job_id = uuid7()
    commands = [command(f"r{n}", model="m", now=NOW) for n in range(9)]
    commands += [command(name, model="m", now=NOW, timeout_s=t) for name, t in SHORT]
    commands += [command(f"job{n}", model="m", now=NOW, job_id=job_id) for n in range(2)]
    await store.submit(commands)
    a, b, c, d, e, f, g, h, i, late, short, job0, _ = (str(cmd.id) for cmd in commands)

    done = await _claim(store, a, b)  # results: one answer, one item error
    outcomes = [
        ItemOutcome(ItemResult(a, output="x"), Timings(1.0, 1.0, 1.0, 3.0)),
        ItemOutcome(
            ItemResult(b, error_code="model_error", error_message="no"), Timings(1, 1, 1, 3)
        ),
    ]
    assert await store.complete_batch(done, attempt=1, outcomes=outcomes, now=NOW, model_ms=1.0)
    crashed = await _claim(store, c, d)  # requeued in halves
    assert len((await store.reap_batch(crashed, now=NOW, outcome=BatchOutcome.CRASHED)).requeued)
    poison = await _claim(store, e)  # alone, its failure budget spent
    assert (await store.reap_batch(poison, now=NOW, outcome=BatchOutcome.CRASHED)).failed
    await store.cancel(uuid.UUID(f), "t1", now=NOW)
    await _claim(store, g)
    await store.cancel(uuid.UUID(g), "t1", now=NOW)
    assert await store.expire([h], NOW, "cannot be met")
    running = await _claim(store, i)
    assert await store.expire_running(running, attempt=1, request_ids=[i], now=NOW)
    assert await store.expire_overdue(NOW + 2.0) == [late]
    retried = await _claim(store, short)  # past its deadline when reaped
    reaped = await store.reap_batch(retried, now=NOW + 10.0, outcome=BatchOutcome.ABANDONED)
    assert reaped.expired == (short,)
    await _claim(store, job0)
    ended = await store.end_job_requests(
        job_id, S.CANCELLED, code="batch_cancelled", message="cancelled", now=NOW
    )
    assert len(ended) == 2

    async with store.engine.connect() as conn:
        moves: list[Any] = list(await conn.exec_driver_sql("SELECT source, target FROM moves"))
        events = (await conn.execute(select(events_t.c.request_id, events_t.c.state))).all()
    made = {(S(source), S(target)) for source, target in moves}
    listed = {(t.source, t.target) for t in TRANSITIONS}
    assert made <= listed
    assert made == listed
    ended_ids = [str(r[0]) for r in events]
    assert len(ended_ids) == len(set(ended_ids)) == len(commands) - 2  # c and d are queued
    await store.engine.dispose()
