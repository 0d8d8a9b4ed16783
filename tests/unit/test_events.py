"""Event topics: a subscriber hears the topics it names and no others."""

from __future__ import annotations

from batchserve.core.domain import BatchClosed, Event, JobChanged, RequestState, StateChange
from batchserve.core.events import JOBS, REQUESTS, MemoryEventBus


async def test_each_subscriber_hears_only_its_topics() -> None:
    bus = MemoryEventBus()
    requests: list[Event] = []
    jobs: list[Event] = []
    both: list[Event] = []
    bus.subscribe(requests.append)  # the default: request and batch changes
    bus.subscribe(jobs.append, topics=(JOBS,))
    subscription = bus.subscribe(both.append, topics=(REQUESTS, JOBS))
    state = StateChange(("r1",), RequestState.SUCCEEDED)
    closed = BatchClosed(model="m", batch_id="b1", outcome="succeeded")
    job = JobChanged(job_id="j1", status="validating")
    for event in (state, closed, job):
        await bus.publish(event)
    assert requests == [state, closed]
    assert jobs == [job]
    assert both == [state, closed, job]
    await subscription.close()
    await bus.publish(job)
    assert both == [state, closed, job]
