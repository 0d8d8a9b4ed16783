"""The engine runner stepped with a fake clock: an engine twin, the embedded store, no sleeps.

Every test drives the same loop the worker runs (accept a batch, step the engine, flush the
writes, tick the clock) by hand, so that what happens at a deadline, a time limit, a cancel, a
lost lease or a hung engine is decided by the code and not by timing.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from batchserve.api.streams import Assembler
from batchserve.core.broker import MemoryRequestQueue
from batchserve.core.domain import BatchItem, BatchMessage, BatchOutcome, Event, SequencesFreed
from batchserve.core.events import REQUESTS, SLOTS, MemoryEventBus
from batchserve.core.ids import uuid7
from batchserve.core.store import JobStore
from batchserve.core.tokenlog import LogEntry, MemoryTokenLog
from batchserve.core.wiring import store_hook
from batchserve.workers.engine_runner import EngineRunner, EngineRunnerConfig
from tests.support.stepped import Clock, ScriptedEngine, sqlite_store, store_seconds, submit

MODEL = "engine"


class Rig:
    def __init__(self, tmp_path: Path, engine: ScriptedEngine | None = None) -> None:
        self.clock = Clock()
        self.events = MemoryEventBus()
        self.tokens = MemoryTokenLog(clock=self.clock)
        self.store: JobStore = sqlite_store(
            tmp_path, on_change=store_hook(self.events, self.tokens)
        )
        self.heard: list[Event] = []
        self.events.subscribe(self.heard.append, topics=(REQUESTS, SLOTS))
        self.engine = engine or ScriptedEngine(clock=self.clock)
        self.stalled = 0
        self.runner = EngineRunner(
            store=self.store,
            events=self.events,
            queue=MemoryRequestQueue(),
            engine=self.engine,
            model=MODEL,
            max_new_tokens=512,
            worker_id="w1",
            config=EngineRunnerConfig(lease_s=2.0, stall_s=30.0),
            clock=self.clock,
            monotonic=self.clock,
            on_stalled=self._on_stalled,
            tokens=self.tokens,
        )

    def _on_stalled(self) -> None:
        self.stalled += 1

    async def start(self) -> None:
        await self.runner.start(background=False)

    async def batch(
        self,
        texts: list[str],
        *,
        max_tokens: int | list[int] = 4,
        timeout_s: float = 600.0,
        time_limit_s: float | None = None,
        isolation_group: str | None = None,
    ) -> tuple[BatchMessage, list[str]]:
        """Requests submitted and claimed as one batch, as the batcher would send it."""
        now = self.clock()
        ids = await submit(
            self.store, texts, model=MODEL, now=now, max_tokens=max_tokens, timeout_s=timeout_s
        )
        message = await self.claim(
            ids, timeout_s=timeout_s, time_limit_s=time_limit_s, isolation_group=isolation_group
        )
        return message, ids

    async def claim(
        self,
        ids: list[str],
        *,
        timeout_s: float = 600.0,
        time_limit_s: float | None = None,
        isolation_group: str | None = None,
    ) -> BatchMessage:
        """Queued requests claimed as one batch, as the batcher would send it."""
        now = self.clock()
        batch_id = uuid7()
        claimed = await self.store.claim_batch(
            batch_id=batch_id,
            model=MODEL,
            request_ids=ids,
            now=now,
            estimated_s=1.0,
            lease_until=now + 10.0,
            isolation_group=isolation_group,
        )
        message = BatchMessage(
            batch_id=str(batch_id),
            model=MODEL,
            dispatched_at=now,
            estimated_s=1.0,
            items=tuple(
                BatchItem(
                    request_id=c.id,
                    input=c.input,
                    messages=c.messages,
                    params=c.params,
                    created_at=c.created_at,
                    received_at=now,
                    deadline=now + timeout_s,
                    time_limit_s=time_limit_s,
                )
                for c in claimed
            ),
        )
        return message

    async def step(self, times: int = 1) -> None:
        for _ in range(times):
            self.clock.advance(0.05)
            self.engine.step()
            await self.runner.flush()

    async def state(self, request_id: str) -> str:
        record = await self.store.get(uuid.UUID(request_id))
        assert record is not None
        return record.state.value

    async def close(self) -> None:
        await self.store.engine.dispose()


@pytest.fixture
async def rig(tmp_path: Path) -> Rig:
    made = Rig(tmp_path)
    await made.start()
    return made


async def test_each_result_is_written_the_moment_its_sequence_leaves(rig: Rig) -> None:
    message, (short, middle, long) = await rig.batch(["a b", "c d", "e f"], max_tokens=[2, 4, 6])
    await rig.runner.accept(message)

    await rig.step(2)
    assert [await rig.state(r) for r in (short, middle, long)] == [
        "succeeded",
        "running",
        "running",
    ]
    record = await rig.store.get(uuid.UUID(short))
    assert record is not None and record.output == " a b"
    assert record.completion_tokens == 2 and record.finish_reason == "length"

    await rig.step(4)
    assert [await rig.state(r) for r in (middle, long)] == ["succeeded", "succeeded"]
    assert await rig.store.open_batches(MODEL) == []  # closed when its last sequence left
    freed = [e for e in rig.heard if isinstance(e, SequencesFreed)]
    assert [list(e.request_ids) for e in freed] == [[short], [middle], [long]]


async def test_the_time_to_store_a_batch_counts_from_its_last_sequence_leaving(
    rig: Rig,
) -> None:
    message, _ = await rig.batch(["a b", "c d"], max_tokens=[2, 4])
    await rig.runner.accept(message)
    complete = rig.store.complete_batch

    async def twenty_ms(*args: Any, **kwargs: Any) -> Any:
        rig.clock.advance(0.02)  # the batch's write takes 20 ms
        return await complete(*args, **kwargs)

    rig.store.complete_batch = twenty_ms  # type: ignore[method-assign]
    before = store_seconds(MODEL)
    await rig.step(4)
    assert await rig.store.open_batches(MODEL) == []
    assert store_seconds(MODEL) == pytest.approx((before[0] + 1, before[1] + 0.02))


async def test_a_running_request_past_its_deadline_is_expired_and_freed(rig: Rig) -> None:
    message, (late, other) = await rig.batch(["a b", "c d"], max_tokens=50, timeout_s=1.0)
    await rig.runner.accept(message)
    await rig.step(3)

    rig.clock.advance(1.0)  # past the deadline, mid-generation
    await rig.runner.tick(rig.clock())
    await rig.step()  # the engine lets the sequences go at its next step

    assert await rig.state(late) == await rig.state(other) == "expired"
    record = await rig.store.get(uuid.UUID(late))
    assert record is not None and record.error_code == "deadline_exceeded"
    assert rig.engine.running == {}  # its room is free
    freed = [r for e in rig.heard if isinstance(e, SequencesFreed) for r in e.request_ids]
    assert sorted(freed) == sorted([late, other])


async def test_a_sequence_past_its_time_limit_making_no_tokens_is_stopped_and_failed(
    rig: Rig,
) -> None:
    message, (stuck,) = await rig.batch(["a b"], max_tokens=500, time_limit_s=5.0)
    await rig.runner.accept(message)
    await rig.step(10)
    rig.engine.stuck.add(stuck)  # the engine steps on, but this sequence makes nothing

    rig.clock.advance(5.0)  # past its limit, but its last token is only 5 s old
    await rig.step()
    await rig.runner.tick(rig.clock())
    assert await rig.state(stuck) == "running"

    grace = rig.runner.config.progress_grace_s
    rig.clock.advance(grace)
    await rig.runner.tick(rig.clock())
    await rig.step()

    record = await rig.store.get(uuid.UUID(stuck))
    assert record is not None and record.state.value == "failed"
    assert record.error_code == "model_error" and "time limit of 5.0 s" in (
        record.error_message or ""
    )
    assert "generating for" in (record.error_message or "")
    assert stuck not in rig.engine.running


async def test_a_sequence_past_its_limit_still_making_tokens_is_left_to_finish(
    rig: Rig,
) -> None:
    # A busy machine: the sequence makes tokens at a third of the learned speed, and so runs
    # past its limit (which the batcher set at four times the learned speed) without being stuck.
    config = rig.runner.config
    assert (config.progress_grace_s, config.slow_factor) == (30.0, 3.0)  # as the README says
    message, (slow,) = await rig.batch(["a b"], max_tokens=50, time_limit_s=10.0)
    await rig.runner.accept(message)
    for _ in range(50):  # 50 tokens, one every 0.5 s: 24.5 s, past its 10 s, under 3 x 10 s
        rig.clock.advance(0.45)
        await rig.step(1)
        await rig.runner.tick(rig.clock())
    record = await rig.store.get(uuid.UUID(slow))
    assert record is not None and record.state.value == "succeeded"
    assert record.completion_tokens == 50


async def test_a_sequence_far_past_its_limit_is_stopped_even_while_making_tokens(
    rig: Rig,
) -> None:
    message, (crawling,) = await rig.batch(["a b"], max_tokens=500, time_limit_s=5.0)
    await rig.runner.accept(message)
    factor = rig.runner.config.slow_factor
    for _ in range(int(5.0 * factor / 0.5) + 2):  # a token every 0.5 s, past 3 x 5 s
        rig.clock.advance(0.45)
        await rig.step(1)
        await rig.runner.tick(rig.clock())
    await rig.runner.flush()
    record = await rig.store.get(uuid.UUID(crawling))
    assert record is not None and record.state.value == "failed"
    assert record.error_code == "model_error"
    assert "time limit of 5.0 s" in (record.error_message or "")


async def test_the_time_limit_counts_from_the_first_token(tmp_path: Path) -> None:
    # An engine of one sequence: the second waits its turn, well past its own limit, before it
    # makes its first token. Waiting on others is no sign of being stuck.
    made = Rig(tmp_path, ScriptedEngine(max_num_seqs=1))
    made.engine.clock = made.clock
    await made.start()
    message, (first, second) = await made.batch(["a b", "c d"], max_tokens=20, time_limit_s=3.0)
    await made.runner.accept(message)
    for _ in range(50):
        # 20 tokens each at 0.1 s: the second finishes 4 s after it was added, past its 3 s,
        # but only 2 s after its first token.
        made.clock.advance(0.1)
        made.engine.step()
        await made.runner.tick(made.clock())
        await made.runner.flush()
    assert await made.state(first) == await made.state(second) == "succeeded"


async def test_a_long_sequence_within_its_limit_is_left_to_finish(rig: Rig) -> None:
    message, (long,) = await rig.batch(["a b"], max_tokens=400, time_limit_s=60.0)
    await rig.runner.accept(message)
    for _ in range(40):  # 400 tokens at 10 a tick of 0.5 s: 20 s, well inside its 60 s
        await rig.step(10)
        await rig.runner.tick(rig.clock())
    assert await rig.state(long) == "succeeded"
    record = await rig.store.get(uuid.UUID(long))
    assert record is not None and record.completion_tokens == 400


async def test_a_cancelled_request_leaves_the_engine_at_its_next_step(rig: Rig) -> None:
    message, (cancelled, kept) = await rig.batch(["a b", "c d"], max_tokens=20)
    await rig.runner.accept(message)
    await rig.step(2)

    await rig.store.cancel(uuid.UUID(cancelled), "t1", now=rig.clock())
    assert rig.engine.aborts == [cancelled]  # the change event reached the runner
    await rig.step()
    assert cancelled not in rig.engine.running
    await rig.step(20)

    assert await rig.state(cancelled) == "cancelled"
    assert await rig.state(kept) == "succeeded"
    assert await rig.store.open_batches(MODEL) == []


async def test_suspects_of_a_crash_run_alone(rig: Rig) -> None:
    busy, (running,) = await rig.batch(["a b"], max_tokens=6)
    await rig.runner.accept(busy)
    await rig.step()
    suspects, suspect_ids = await rig.batch(["x y", "z w"], max_tokens=3, isolation_group="g:0")
    await rig.runner.accept(suspects)
    later, (after,) = await rig.batch(["p q"], max_tokens=3)
    await rig.runner.accept(later)

    # The suspects wait for the engine to empty, and nothing joins them while they run.
    assert set(rig.engine.added) == {running}
    await rig.step(5)
    assert set(rig.engine.added) == {running, *suspect_ids}
    assert after not in rig.engine.added
    await rig.step(3)
    assert after in rig.engine.added
    await rig.step(3)
    assert {await rig.state(r) for r in [running, *suspect_ids, after]} == {"succeeded"}


async def test_a_batch_whose_lease_is_lost_is_stopped_and_writes_nothing(rig: Rig) -> None:
    message, (first, second) = await rig.batch(["a b", "c d"], max_tokens=30)
    await rig.runner.accept(message)
    await rig.step(2)
    # Maintenance took the batch for a dead worker's (its lease looked expired) and requeued it.
    reaped = await rig.store.reap_batch(
        uuid.UUID(message.batch_id), now=rig.clock(), outcome=BatchOutcome.CRASHED
    )
    assert len(reaped.requeued) == 2  # in halves, as suspects

    await rig.runner.tick(rig.clock())  # the renewal finds the lease gone
    await rig.step(30)

    assert rig.engine.running == {}
    assert rig.runner.open_batches == 0
    for request_id in (first, second):
        record = await rig.store.get(uuid.UUID(request_id))
        assert record is not None and record.output is None  # nothing of this attempt stored


async def test_a_hung_engine_lets_its_leases_run_out(rig: Rig) -> None:
    message, _ = await rig.batch(["a b"], max_tokens=30)
    await rig.runner.accept(message)
    await rig.step(2)
    rig.engine.hung = True
    lease_before = await rig.store.open_batches(MODEL)

    rig.clock.advance(31.0)  # no step for longer than stall_s
    await rig.runner.tick(rig.clock())

    assert rig.stalled == 1 and rig.runner.stalled
    assert await rig.store.open_batches(MODEL) == lease_before  # not renewed: it will expire


async def test_a_healthy_engine_keeps_its_leases(rig: Rig) -> None:
    message, _ = await rig.batch(["a b"], max_tokens=300)
    await rig.runner.accept(message)
    [(_, lease_at_start)] = await rig.store.open_batches(MODEL)
    for _ in range(10):
        await rig.step(10)
        await rig.runner.tick(rig.clock())
    [(_, lease_now)] = await rig.store.open_batches(MODEL)
    assert lease_now > lease_at_start + 4.0 and rig.stalled == 0


async def test_a_duplicate_delivery_runs_once(rig: Rig) -> None:
    message, (only,) = await rig.batch(["a b"], max_tokens=3)
    await rig.runner.accept(message)
    await rig.runner.accept(message)  # the broker delivered it again

    assert rig.engine.added == [only]
    await rig.step(3)
    assert await rig.state(only) == "succeeded"


def samples(name: str) -> float:
    return REGISTRY.get_sample_value(f"batchserve_{name}_count", {"model": MODEL}) or 0.0


async def test_each_step_streams_its_deltas_before_the_result_is_stored(rig: Rig) -> None:
    names = (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "time_per_output_token_seconds",
    )
    before = {name: samples(name) for name in names}
    message, ids = await rig.batch(["a b c", "d e"], max_tokens=[3, 5])
    await rig.runner.accept(message)
    await rig.step(1)
    for request_id in ids:  # the first token is in the log while the request runs
        entries = await rig.tokens.read(request_id)
        assert entries is not None
        assert [(e.kind, e.state) for _, e in entries] == [("state", "running"), ("delta", "")]
        assert {e.batch for _, e in entries} == {message.batch_id}
    await rig.step(5)

    for request_id in ids:
        record = await rig.store.get(uuid.UUID(request_id))
        assert record is not None and record.state.value == "succeeded" and record.output
        entries = await rig.tokens.read(request_id)
        assert entries is not None
        deltas = [e.text for _, e in entries if e.kind == "delta"]
        assert "".join(deltas) == record.output and len(deltas) == record.completion_tokens
        assert (entries[0][1].state, entries[-1][1].state) == ("running", "succeeded")
        timings = record.timings
        assert timings is not None and timings.ttft_ms is not None
        assert 0 < timings.ttft_ms < timings.total_ms  # the first of several steps
    observed = {name: samples(name) - before[name] for name in names}
    assert observed == {  # per request; between tokens: 2 + 4 gaps
        "time_to_first_token_seconds": 2,
        "inter_token_latency_seconds": 6,
        "time_per_output_token_seconds": 2,
    }


async def test_a_request_run_again_streams_the_new_run_from_its_start(rig: Rig) -> None:
    first, (only,) = await rig.batch(["a b c d e f"], max_tokens=6)
    await rig.runner.accept(first)
    await rig.step(2)  # two words out, then the worker is taken for dead
    await rig.store.reap_batch(
        uuid.UUID(first.batch_id), now=rig.clock(), outcome=BatchOutcome.CRASHED
    )
    await rig.runner.tick(rig.clock())  # the renewal finds the lease gone: stopped
    await rig.step(1)
    again = await rig.claim([only])
    await rig.runner.accept(again)
    # The old run's worker, not yet stopped, still writes: its text must not count.
    rig.tokens.append([(only, LogEntry.delta(first.batch_id, " stale"))])
    await rig.step(8)

    record = await rig.store.get(uuid.UUID(only))
    assert record is not None and record.state.value == "succeeded" and record.attempts == 2
    entries = await rig.tokens.read(only)
    assert entries is not None
    assembler = Assembler()
    events = [ev for entry_id, entry in entries for ev in assembler.feed(entry_id, entry)]
    names = [ev.event for ev in events]
    assert names.count("reset") == 1 and names.index("reset") > names.index("delta")
    assert assembler.text == record.output  # the new run's text alone, whole
    final = assembler.finish(record, retention_s=3600.0)
    assert [ev.event for ev in final] == ["state"] and assembler.text == record.output
