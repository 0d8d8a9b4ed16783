"""A request's stream on the embedded store and token log: resumed after any event it is
exactly the rest, and whatever the log lost, the text a client ends with is the stored answer."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from batchserve.api.openai_stream import Diverged, next_piece
from batchserve.api.services import ApiServices
from batchserve.api.streams import EventId, StreamEvent, follow, parse_event_id
from batchserve.core.domain import BatchOutcome, ItemResult, RequestRecord, Timings
from batchserve.core.errors import InvalidInput
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.core.store import BatchStart, ItemOutcome, JobStore
from batchserve.core.tokenlog import LogEntry, MemoryTokenLog, RedisTokenLog
from batchserve.testing.deployment import free_port
from tests.support.stepped import Clock, sqlite_store, submit
from tests.support.streams import assembled

TENANT = "t1"  # the stepped helpers' tenant
ANSWER = "Hello, world"


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock()
        self.tokens = MemoryTokenLog(clock=self.clock)
        self.store: JobStore = sqlite_store(tmp_path, on_change=self.tokens.on_change)
        adapters = SimpleNamespace(store=self.store, tokens=self.tokens)
        self.services = cast(ApiServices, SimpleNamespace(adapters=adapters, settings=Settings()))

    async def request(self) -> str:
        (request_id,) = await submit(self.store, ["hi"], now=self.clock())
        return request_id

    async def run(self, request_id: str, pieces: list[str], answer: str | None = ANSWER) -> str:
        """Claim the request under a new batch, stream ``pieces``, store ``answer`` (``None``:
        the worker dies instead, and the request is requeued)."""
        now = self.clock()
        batch_id = uuid7()
        await self.store.claim_batch(
            batch_id=batch_id,
            model="engine",
            request_ids=[request_id],
            now=now,
            estimated_s=1.0,
            lease_until=now + 10,
        )
        start = await self.store.start_batch(batch_id, f"w{batch_id}", now, 10.0)
        assert isinstance(start, BatchStart)
        self.tokens.append([(request_id, LogEntry.delta(str(batch_id), p)) for p in pieces])
        if answer is None:
            await self.store.reap_batch(batch_id, now=now, outcome=BatchOutcome.CRASHED)
            return str(batch_id)
        result = ItemResult(request_id, output=answer, finish_reason="stop", completion_tokens=2)
        timings = Timings(queued_ms=1, batch_wait_ms=1, model_ms=1, total_ms=3)
        await self.store.complete_batch(
            batch_id,
            attempt=start.attempt,
            outcomes=[ItemOutcome(result, timings)],
            now=now,
            model_ms=1.0,
        )
        return str(batch_id)

    async def record(self, request_id: str) -> RequestRecord:
        record = await self.store.get(uuid.UUID(request_id), TENANT)
        assert record is not None
        return record

    async def events(self, request_id: str, resume: EventId | None = None) -> list[StreamEvent]:
        record = await self.record(request_id)
        return [e async for e in follow(self.services, record, TENANT, resume, wait_s=0.1)]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    made = Rig(tmp_path)
    yield made
    await made.store.engine.dispose()


async def test_a_finished_request_replays_its_run_and_ends_with_the_stored_request(
    rig: Rig,
) -> None:
    request_id = await rig.request()
    batch_id = await rig.run(request_id, ["Hello", ", world"])
    events = await rig.events(request_id)
    assert [(e.event, e.data.get("text") or e.data.get("status")) for e in events] == [
        ("state", "running"),
        ("delta", "Hello"),
        ("delta", ", world"),
        ("state", "succeeded"),
    ]
    assert events[0].data["batch_id"] == batch_id
    assert events[-1].data["request"]["output"]["text"] == ANSWER
    assert assembled(events) == ANSWER
    ids = [e.id for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


async def test_resumed_after_any_event_the_stream_is_exactly_the_rest(rig: Rig) -> None:
    request_id = await rig.request()
    first = await rig.run(request_id, ["Hel", "lo"], answer=None)  # its worker died
    await rig.run(request_id, ["Hal", "lo"], answer="Hallo")  # the run that counts
    rig.tokens.append([(request_id, LogEntry.delta(first, "p!"))])  # the first one, late
    events = await rig.events(request_id)
    assert [e.event for e in events] == [
        "state", "delta", "delta", "reset", "state", "state", "delta", "delta", "state"
    ]  # fmt: skip
    assert assembled(events) == "Hallo" and (await rig.record(request_id)).attempts == 2
    for n, event in enumerate(events):
        resumed = await rig.events(request_id, parse_event_id(str(event.id)))
        assert resumed == events[n + 1 :], f"resumed after {event.id}"
        assert assembled(resumed, assembled(events[: n + 1])) == "Hallo"


async def test_a_stream_whose_log_is_gone_replays_the_stored_answer(rig: Rig) -> None:
    request_id = await rig.request()
    await rig.run(request_id, ["Hello", ", wor"])
    events = await rig.events(request_id)
    rig.clock.advance(rig.tokens.config.ttl_s + 1)  # the log expired
    replay = await rig.events(request_id)
    assert [e.event for e in replay] == ["delta", "state"] and assembled(replay) == ANSWER
    # A client that had part of it before the log went: the whole answer over again.
    resumed = await rig.events(request_id, events[1].id)
    assert [e.event for e in resumed] == ["reset", "delta", "state"]
    assert assembled(resumed, "Hello") == ANSWER


async def test_a_finished_requests_log_lingers_for_a_broken_stream_to_resume(rig: Rig) -> None:
    request_id = await rig.request()
    await rig.run(request_id, ["Hello", ", wor"])
    events = await rig.events(request_id)
    linger_s = rig.tokens.config.linger_s
    assert linger_s < rig.tokens.config.ttl_s
    rig.clock.advance(linger_s - 1)  # within the linger: exactly the rest
    assert await rig.events(request_id, events[1].id) == events[2:]
    rig.clock.advance(2)  # past it, long before the TTL: the log is gone
    resumed = await rig.events(request_id, events[1].id)
    assert [e.event for e in resumed] == ["reset", "delta", "state"]
    assert assembled(resumed, "Hello") == ANSWER


async def test_a_log_that_lost_pieces_is_made_whole_from_the_stored_answer(rig: Rig) -> None:
    request_id = await rig.request()
    await rig.run(request_id, ["Hello"])  # ", world" never reached the log (Redis away)
    events = await rig.events(request_id)
    assert [e.event for e in events][-2:] == ["delta", "state"]
    assert events[-2].data["text"] == ", world" and assembled(events) == ANSWER


async def test_with_redis_down_a_stream_is_the_stored_answer(rig: Rig) -> None:
    request_id = await rig.request()
    await rig.run(request_id, ["Hello"])
    down = RedisTokenLog(f"redis://127.0.0.1:{free_port()}/0", "down")
    rig.services.adapters.tokens = down
    try:
        events = await rig.events(request_id)
    finally:
        await down.close()
    assert [e.event for e in events] == ["delta", "state"] and assembled(events) == ANSWER


@pytest.mark.parametrize("value", ["x", "1-2", "1-2/", "a-b/0", "-1-0/0", "1-2/e", "1" * 30])
def test_a_last_event_id_not_of_ours_is_refused_by_name(value: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_event_id(value)
    assert refused.value.field == "Last-Event-ID"


def test_event_ids_order_the_end_after_every_entry() -> None:
    ids = [parse_event_id(v) for v in ("0-0/0", "5-0/0", "5-0/1", "5-1/0", "5-1/e0", "5-1/e1")]
    assert ids == sorted(ids, key=lambda i: cast(Any, i))
    assert str(ids[4]) == "5-1/e0"


def test_an_openai_stream_repeats_nothing_and_refuses_a_different_answer() -> None:
    assert next_piece("", "Hel") == "Hel"
    assert next_piece("Hel", "Hello") == "lo"
    assert next_piece("Hello", "He") == ""  # a new run, still repeating what was sent
    assert next_piece("Hello", "Hello, world") == ", world"
    with pytest.raises(Diverged):
        next_piece("Hello", "Help")
