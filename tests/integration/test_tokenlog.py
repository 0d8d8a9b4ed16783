"""The token log on both backends, the Redis Stream and the embedded mode's in-memory twin: the
same order, offsets, cap and expiry, and a reader that starts a retried request's text over."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis

from batchserve.api.streams import Assembler
from batchserve.core.domain import RequestState, StateChange
from batchserve.core.tokenlog import (
    START,
    LogEntry,
    MemoryTokenLog,
    RedisTokenLog,
    TokenLog,
    TokenLogConfig,
    entry_key,
)
from batchserve.testing.deployment import free_port
from tests.support import servers
from tests.support.stepped import Clock

CONFIG = TokenLogConfig(ttl_s=60.0, linger_s=5.0, max_entries=100)


class Backend:
    def __init__(self, kind: str, namespace: str) -> None:
        self.kind = kind
        self.clock = Clock()
        self.log: TokenLog
        if kind == "memory":
            self.log = MemoryTokenLog(CONFIG, clock=self.clock)
        elif kind == "redis-resp3":  # the same, over the newer protocol (other reply shapes)
            self.log = RedisTokenLog(f"{servers.REDIS_URL}?protocol=3", namespace, CONFIG)
        else:
            self.log = RedisTokenLog(servers.REDIS_URL, namespace, CONFIG)
        self.namespace = namespace


@pytest.fixture(params=["memory", "redis", "redis-resp3"])
async def backend(request: pytest.FixtureRequest, run_id: str) -> AsyncIterator[Backend]:
    if request.param != "memory":
        request.getfixturevalue("live_servers")
    made = Backend(request.param, f"{run_id}tokens{id(request)}")
    try:
        yield made
    finally:
        await made.log.close()
        servers.delete_redis_keys(made.namespace)


async def read_all(
    log: TokenLog, request_id: str, after: str = START
) -> list[tuple[str, LogEntry]]:
    found = await log.read(request_id, after, count=10_000)
    assert found is not None
    return found


async def test_entries_come_back_in_order_from_any_offset(backend: Backend) -> None:
    log = backend.log
    log.append([("r1", LogEntry.of_state("running", "b1"))])
    log.append(
        [("r1", LogEntry.delta("b1", f" w{n}")) for n in range(5)]
        + [("r2", LogEntry.delta("b9", "x"))]
    )
    await log.flush()

    entries = await read_all(log, "r1")
    assert [e.kind for _, e in entries] == ["state", *["delta"] * 5]
    assert "".join(e.text for _, e in entries) == " w0 w1 w2 w3 w4"
    keys = [entry_key(i) for i, _ in entries]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    middle = entries[2][0]
    assert [e.text for _, e in await read_all(log, "r1", middle)] == [" w2", " w3", " w4"]
    assert await read_all(log, "r1", entries[-1][0]) == []
    assert [e.text for _, e in await read_all(log, "r2")] == ["x"]  # one log per request
    assert await read_all(log, "nobody") == []


async def test_a_reader_waiting_on_the_log_wakes_at_the_next_write(backend: Backend) -> None:
    log = backend.log
    log.append([("r1", LogEntry.of_state("running", "b1"))])
    await log.flush()
    ((last, _),) = await read_all(log, "r1")
    started = time.monotonic()
    assert await log.read("r1", last, block_s=0.2) == []  # nothing new: waits, then none
    assert time.monotonic() - started >= 0.15

    waiting = asyncio.ensure_future(log.read("r1", last, block_s=10.0))
    await asyncio.sleep(0.05)
    log.append([("r1", LogEntry.delta("b1", "hi"))])
    found = await asyncio.wait_for(waiting, 5.0)
    assert found is not None and [e.text for _, e in found] == ["hi"]


async def test_the_log_is_capped_and_keeps_the_newest(backend: Backend) -> None:
    log = backend.log
    for n in range(1000):
        log.append([("r1", LogEntry.delta("b1", str(n)))])
    await log.flush()
    entries = await read_all(log, "r1")
    cap = CONFIG.max_entries
    # Redis trims whole nodes of its stream (100 entries each by default): about the cap.
    if backend.kind == "memory":
        assert len(entries) == cap
    else:
        assert cap <= len(entries) <= cap + 100
    assert entries[-1][1].text == "999"
    assert [int(e.text) for _, e in entries] == list(range(1000 - len(entries), 1000))


async def test_the_log_expires_after_its_last_write(backend: Backend) -> None:
    log = backend.log
    log.append([("r1", LogEntry.delta("b1", "a"))])
    await log.flush()
    if isinstance(log, RedisTokenLog):
        client = redis.Redis.from_url(servers.REDIS_URL)
        try:
            ttl_s = client.ttl(log.key("r1"))
            assert isinstance(ttl_s, int) and CONFIG.ttl_s - 5 <= ttl_s <= CONFIG.ttl_s
            assert log.key("r1").startswith(f"{backend.namespace}.tokens.")
        finally:
            client.close()
        return
    backend.clock.advance(CONFIG.ttl_s - 1)
    log.append([("r1", LogEntry.delta("b1", "b"))])  # a write renews it
    backend.clock.advance(CONFIG.ttl_s - 1)
    assert [e.text for _, e in await read_all(log, "r1")] == ["a", "b"]
    backend.clock.advance(2)
    assert await read_all(log, "r1") == []


async def test_a_finished_requests_log_lingers_only_a_little(backend: Backend) -> None:
    log = backend.log
    log.append(
        [("r1", LogEntry.of_state("running", "b1")), ("r2", LogEntry.of_state("running", "b1"))]
    )
    await log.flush()
    await log.on_change(StateChange(("r1",), RequestState.SUCCEEDED, batch_id="b1"))
    log.append([("r2", LogEntry.delta("b1", "more"))])
    await log.flush()
    if isinstance(log, RedisTokenLog):
        client = redis.Redis.from_url(servers.REDIS_URL)
        try:
            ended, running = client.ttl(log.key("r1")), client.ttl(log.key("r2"))
        finally:
            client.close()
        assert isinstance(ended, int) and 0 < ended <= CONFIG.linger_s
        assert isinstance(running, int) and CONFIG.ttl_s - 5 <= running <= CONFIG.ttl_s
        return
    backend.clock.advance(CONFIG.linger_s - 1)
    assert [e.state for _, e in await read_all(log, "r1")] == ["running", "succeeded"]
    backend.clock.advance(2)
    assert await read_all(log, "r1") == []
    assert [e.kind for _, e in await read_all(log, "r2")] == ["state", "delta"]


async def test_an_answer_the_stored_result_repeats_goes_only_to_a_log_that_exists(
    backend: Backend,
) -> None:
    log = backend.log
    log.append([("r1", LogEntry.of_state("running", "b1"))])
    log.append([(r, LogEntry.delta("b1", "answer")) for r in ("r1", "r2")], create=False)
    await log.flush()
    assert [e.kind for _, e in await read_all(log, "r1")] == ["state", "delta"]
    assert await read_all(log, "r2") == []  # no log made for it (nor an expiry to keep)
    if isinstance(log, RedisTokenLog):
        client = redis.Redis.from_url(servers.REDIS_URL)
        try:
            assert not client.exists(log.key("r2"))
        finally:
            client.close()


async def test_a_store_change_logs_each_request_state(backend: Backend) -> None:
    log = backend.log
    await log.on_change(StateChange(("r1", "r2"), RequestState.RUNNING, batch_id="b1"))
    await log.on_change(StateChange(("r1",), RequestState.SUCCEEDED, batch_id="b1"))
    await log.flush()
    assert [(e.state, e.batch) for _, e in await read_all(log, "r1")] == [
        ("running", "b1"),
        ("succeeded", "b1"),
    ]
    assert [e.state for _, e in await read_all(log, "r2")] == ["running"]


async def test_a_new_attempt_starts_the_text_over(backend: Backend) -> None:
    log = backend.log
    log.append(
        [
            ("r1", LogEntry.of_state("running", "b1")),
            ("r1", LogEntry.delta("b1", "Hel")),
            ("r1", LogEntry.of_state("queued", None)),  # the worker died: requeued
            ("r1", LogEntry.of_state("running", "b2")),
            ("r1", LogEntry.delta("b1", "lo?")),  # the old run, not yet stopped
            ("r1", LogEntry.delta("b2", "Hello")),
            ("r1", LogEntry.delta("b2", ", world")),
            ("r1", LogEntry.of_state("succeeded", "b2")),
        ]
    )
    await log.flush()
    assembler = Assembler()
    events = [
        (ev.event, ev.data.get("text") or ev.data.get("status"))
        for entry_id, entry in await read_all(log, "r1")
        for ev in assembler.feed(entry_id, entry)
    ]
    assert events == [
        ("state", "running"),
        ("delta", "Hel"),
        ("reset", None),
        ("state", "queued"),
        ("state", "running"),
        ("delta", "Hello"),
        ("delta", ", world"),
    ]
    assert assembler.text == "Hello, world" and assembler.ended


async def test_redis_down_costs_the_writer_nothing_and_the_reader_knows(
    live_servers: None,
) -> None:
    log = RedisTokenLog(f"redis://127.0.0.1:{free_port()}/0", "down", CONFIG)
    try:
        started = time.monotonic()
        log.append([("r1", LogEntry.delta("b1", "lost"))])
        assert time.monotonic() - started < 0.05  # queued, never awaited
        await log.flush()  # the write fails, logged and dropped
        log.append([("r1", LogEntry.delta("b1", "dropped at once"))])  # while it is down
        assert await log.read("r1") is None
    finally:
        await log.close()


async def test_thousands_of_ends_at_once_are_all_written_in_order(backend: Backend) -> None:
    """A bulk job's cancellation ends thousands at once: every log gets its end after what it
    had, and lingers only a little (on Redis: several script calls, a chunk each)."""
    log = backend.log
    ids = [f"r{n}" for n in range(700)]
    log.append([(r, LogEntry.of_state("running", "b1")) for r in ids])
    await log.on_change(StateChange(tuple(ids), RequestState.CANCELLED, batch_id="b1"))
    await log.flush()
    for request_id in (ids[0], ids[300], ids[-1]):
        states = [e.state for _, e in await read_all(log, request_id)]
        assert states == ["running", "cancelled"]
    if isinstance(log, RedisTokenLog):
        client = redis.Redis.from_url(servers.REDIS_URL)
        try:
            ttls = {client.ttl(log.key(r)) for r in ids}
        finally:
            client.close()
        assert all(isinstance(t, int) and 0 < t <= CONFIG.linger_s for t in ttls)


@pytest.mark.usefixtures("live_servers")
async def test_a_key_redis_refuses_costs_only_its_own_entries(run_id: str) -> None:
    """A log's key holding something else (an operator's mistake): its entries are refused,
    the others in the same write are written, and the writer goes on writing."""
    namespace = f"{run_id}refused"
    log = RedisTokenLog(servers.REDIS_URL, namespace, CONFIG)
    client = redis.Redis.from_url(servers.REDIS_URL)
    try:
        client.set(log.key("taken"), "not a stream")
        log.append([(r, LogEntry.of_state("running", "b1")) for r in ("a", "taken", "b")])
        await log.flush()
        assert [e.state for _, e in await read_all(log, "a")] == ["running"]
        assert [e.state for _, e in await read_all(log, "b")] == ["running"]
        assert client.get(log.key("taken")) == b"not a stream"
        log.append([("a", LogEntry.delta("b1", "next"))])  # not dropped as if Redis were down
        await log.flush()
        assert [e.kind for _, e in await read_all(log, "a")] == ["state", "delta"]
    finally:
        client.close()
        await log.close()
        servers.delete_redis_keys(namespace)
