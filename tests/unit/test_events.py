"""Event topics: a subscriber hears the topics it names and no others."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from batchserve.core.domain import (
    BatchClosed,
    Event,
    JobChanged,
    Lane,
    RequestRecord,
    RequestState,
    SequencesFreed,
    StateChange,
    Timings,
    decode_event,
    encode_event,
)
from batchserve.core.events import CANCELS, JOBS, REQUESTS, SLOTS, MemoryEventBus, event_topics


async def test_each_subscriber_hears_only_its_topics() -> None:
    """Request changes, slots freed and cancellations each reach only who asked for them: the
    batcher hears no request's change, a worker only cancellations (which long-polls hear too,
    among the request changes), and a cancellation reaches each subscriber once."""
    bus = MemoryEventBus()
    requests: list[Event] = []
    slots: list[Event] = []
    cancels: list[Event] = []
    jobs: list[Event] = []
    both: list[Event] = []
    bus.subscribe(requests.append)  # the default: requests' state changes
    bus.subscribe(slots.append, topics=(SLOTS,))
    bus.subscribe(cancels.append, topics=(CANCELS,))
    bus.subscribe(jobs.append, topics=(JOBS,))
    subscription = bus.subscribe(both.append, topics=(REQUESTS, JOBS))
    state = StateChange(("r1",), RequestState.SUCCEEDED)
    cancelled = StateChange(("r2",), RequestState.CANCELLED)
    closed = BatchClosed(model="m", batch_id="b1", outcome="succeeded")
    freed = SequencesFreed("m", "b1", ("r3",))
    job = JobChanged(job_id="j1", status="validating")
    for event in (state, cancelled, closed, freed, job):
        await bus.publish(event)
    assert requests == [state, cancelled]
    assert slots == [closed, freed]
    assert cancels == [cancelled]
    assert jobs == [job]
    assert both == [state, cancelled, job]
    await subscription.close()
    await bus.publish(job)
    assert both == [state, cancelled, job]
    assert event_topics(cancelled) == (REQUESTS, CANCELS)


def full_record(**changes: Any) -> RequestRecord:
    """A record with every field set (a field added to RequestRecord must be set here too:
    the round trip below is what keeps the notification's copy whole)."""
    record = RequestRecord(
        id=uuid.uuid4(),
        tenant="t1",
        model="echo-100ms",
        lane=Lane.BULK,
        state=RequestState.SUCCEEDED,
        created_at=datetime(2026, 12, 5, 5, 0, 0, 123456, tzinfo=UTC),
        deadline=datetime(2026, 12, 5, 5, 10, tzinfo=UTC),
        attempts=2,
        batch_id=uuid.uuid4(),
        finished_at=datetime(2026, 12, 5, 5, 0, 1, 654321, tzinfo=UTC),
        output="héllo \u2603 \\n",
        finish_reason="stop",
        error_code="model_error",
        error_message="boom",
        prompt_tokens=3,
        completion_tokens=4,
        timings=Timings(1.5, 2.5, 100.25, 104.25, ttft_ms=103.0),
        metadata={"k": "v"},
        idempotency_key="key-1",
        fingerprint="fp",
        webhook_url="https://example.com/h",
    )
    unset = [f.name for f in dataclasses.fields(record) if getattr(record, f.name) is None]
    assert not unset, f"set {unset} in full_record"
    return dataclasses.replace(record, **changes)


def test_a_state_change_carries_its_records_across_the_wire_whole() -> None:
    full = full_record()
    sparse = full_record(
        batch_id=None, finished_at=None, output=None, timings=None, metadata=None, attempts=0
    )
    change = StateChange(
        (str(full.id), str(sparse.id)), RequestState.SUCCEEDED, "b1", "m", (full, sparse)
    )
    decoded = decode_event(encode_event(change))
    assert isinstance(decoded, StateChange)
    assert dataclasses.replace(decoded, records=change.records) == change
    ids = [str(full.id), str(sparse.id)]
    assert (
        decoded.records_for(ids)
        == change.records_for(ids)
        == dict(zip(ids, change.records, strict=True))
    )
    assert decoded.records_for([str(full.id), "other"]) == {str(full.id): full}
    assert encode_event(decoded) == encode_event(change)  # passed on as it came
    # What any version's record_from_wire reads: uuids as strings, times in ISO 8601 with
    # their offset, enums by value, every field by name.
    wire = orjson.loads(encode_event(change))["records"][0]
    assert list(wire) == [f.name for f in dataclasses.fields(full)]
    assert wire["id"] == str(full.id) and wire["batch_id"] == str(full.batch_id)
    assert wire["created_at"] == full.created_at.isoformat() and "+" in wire["created_at"]
    assert (wire["state"], wire["lane"]) == (full.state.value, full.lane.value)
    assert full.timings is not None and wire["timings"] == dataclasses.asdict(full.timings)
    plain = StateChange(("r1",), RequestState.RUNNING, "b1")
    assert "records" not in orjson.loads(encode_event(plain))
    assert decode_event(encode_event(plain)) == plain
