"""The front door benchmark's baseline batcher and its verdicts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from batchserve.bench import baseline
from batchserve.bench.baseline import InProcessBatcher
from batchserve.bench.frontdoor import judge
from batchserve.bench.loadgen import CollectorPauses, open_loop
from batchserve.bench.stack import tcp_counters, tcp_delta
from batchserve.core.loops import GC_YOUNG_THRESHOLD
from batchserve.testing.deployment import free_port


async def test_the_baseline_batches_what_waits_and_answers_each_caller_its_own() -> None:
    batcher = InProcessBatcher(batch=32, batch_s=0.01, slots=1)
    batcher.start()
    try:
        sent = time.time()
        texts = [f"request {n}" for n in range(70)]
        answers = await asyncio.gather(*(batcher.answer(t) for t in texts))
        answered = time.time()
    finally:
        await batcher.stop()
    assert [a.output for a in answers] == texts
    assert sorted({a.batch_size for a in answers}) == [6, 32]  # 32, 32 and the 6 left
    # Each answer says when its batch's model ended: three batches, one after the other.
    ends = sorted({a.model_ended_at for a in answers})
    # (a millisecond's slack: the wall clock the answers carry against the loop's own)
    assert len(ends) == 3 and sent + 0.009 <= ends[0] and ends[-1] <= answered
    assert all(later - earlier >= 0.009 for earlier, later in itertools.pairwise(ends))


async def test_the_baseline_runs_one_batch_a_slot_at_once() -> None:
    batcher = InProcessBatcher(batch=4, batch_s=0.05, slots=2)
    batcher.start()
    try:
        started = asyncio.get_running_loop().time()
        answers = await asyncio.gather(*(batcher.answer(str(n)) for n in range(8)))
        took = asyncio.get_running_loop().time() - started
    finally:
        await batcher.stop()
    assert [a.output for a in answers] == [str(n) for n in range(8)]
    assert all(a.batch_size == 4 for a in answers)
    assert took < 0.09  # two batches side by side, not one after the other (0.1 s)


def _row(path: str, rate: float, p50: float, p99: float, served: float) -> dict[str, object]:
    return {"path": path, "offered_rps": rate, "p50_ms": p50, "p99_ms": p99, "served_rps": served}


def test_each_path_is_judged_against_the_baseline_at_its_own_rate() -> None:
    rows = [
        _row("baseline", 30.0, 150.0, 200.0, 30.0),
        _row("longpoll", 30.0, 158.0, 229.0, 30.0),  # +8, +29: met
        _row("sync", 30.0, 161.0, 210.0, 30.0),  # +11 at p50: not met
        _row("baseline", 300.0, 180.0, 300.0, 290.0),
        _row("longpoll", 300.0, 900.0, 2000.0, 250.0),  # no goal at 300/s
    ]
    verdict = judge(rows, ideal_rps=320.0)
    assert [(g["path"], g["offered_rps"], g["met"]) for g in verdict["latency"]] == [
        ("longpoll", 30.0, True),
        ("sync", 30.0, False),
        ("longpoll", 300.0, None),
    ]
    assert verdict["latency"][0]["p50_over_baseline_ms"] == 8.0
    assert verdict["served_vs_ideal"] == {"baseline": 0.906, "longpoll": 0.781, "sync": 0.094}


async def test_the_load_generator_is_open_loop_past_any_connection_count() -> None:
    """Every scenario's generator (frontdoor, overhead, ingest, chaos), by default: 400
    requests sent in 0.4 s to a server that holds each until all 400 are in (or 20 s pass) are
    all in flight at once, so no send waits for an earlier caller's connection (with the
    generator's former default of 256 connections, 144 of them would, and the peak would stay
    256). The server holds them for the barrier rather than a fixed time, so a slow machine that
    takes longer than that time to send them all does not fail the test."""
    total = 400
    in_flight = peak = 0
    all_in = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == total:
            all_in.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), 20.0)
        in_flight -= 1
        return web.json_response({"id": "x"}, status=202)

    async with _answering(slow) as url:
        schedule = [n / 1000.0 for n in range(total)]
        result = await open_loop(url, schedule, lambda n: {"n": n})
    assert len(result.accepted) == total and result.errors == 0
    assert peak == total


def test_the_rounds_count_callers_the_kernel_queued_past_a_full_accept_queue() -> None:
    """A listener that never accepts, with room for one waiting connection, and eight callers:
    the kernel's counters the front door's rounds report show the overflow (they are the
    host's, so others' traffic can only add to them)."""
    before = tcp_counters()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    callers = []
    try:
        for _ in range(8):
            caller = socket.socket()
            caller.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                caller.connect(listener.getsockname())
            callers.append(caller)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            delta = tcp_delta(before, tcp_counters())
            if delta["listen_overflows"] >= 1:
                break
            time.sleep(0.05)
    finally:
        for caller in callers:
            caller.close()
        listener.close()
    assert set(delta) == {"accepted", "listen_overflows", "resets"}
    assert delta["listen_overflows"] >= 1 and delta["accepted"] >= 1


_COLLECTOR_PROBE = """
import asyncio, gc, sys
from batchserve.bench.command import run_loop

async def main():
    return gc.get_threshold()[0], gc.get_freeze_count(), type(asyncio.get_running_loop()).__module__

print(*run_loop(main()))
"""


def test_the_load_generator_runs_with_its_collector_tuned_as_the_roles_are() -> None:
    """At Python's default thresholds the generator's full collections paused it for tens of
    milliseconds, timing every waiting caller late; the bench's loop freezes start-up's
    objects and collects at the roles' threshold (in a process of its own: it changes the
    interpreter's collector)."""
    found = subprocess.run(
        [sys.executable, "-c", _COLLECTOR_PROBE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert int(found[0]) == GC_YOUNG_THRESHOLD
    assert int(found[1]) > 1000  # what start-up made is out of every pass
    assert found[2].startswith("uvloop")


def test_the_baseline_is_served_as_the_api_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor it is compared with runs on the API's loop and collector settings, so the
    front door's gap is batchserve's path, not a slower loop on one side."""
    served: dict[str, Any] = {}
    tuned: list[bool] = []
    monkeypatch.setattr(baseline.uvicorn, "run", lambda app, **kw: served.update(kw, app=app))
    monkeypatch.setattr(baseline.loops, "tune_gc", lambda: tuned.append(True))
    monkeypatch.setattr(sys, "argv", ["baseline", "--port", "1"])
    baseline.main()
    assert tuned == [True]
    assert served["loop"] == "uvloop" and served["http"] == "httptools"
    assert served["access_log"] is False


def test_the_load_generator_times_its_own_collections() -> None:
    """What the generator's collector paused it for while it sent, by pass: a full one counts
    as full, and nothing is timed once the step is over."""
    pauses = CollectorPauses()
    with pauses:
        gc.collect()
        gc.collect(0)
    gc.collect()
    found = pauses.as_dict()
    assert found["collections"] == 2 and found["full"] == 1
    assert 0 < found["longest_ms"] <= found["ms"]


@pytest.mark.parametrize("collect", [False, True])
async def test_the_load_generator_sends_with_its_collector_off_unless_told(collect: bool) -> None:
    """A collection stops the generator and times every answer meanwhile late, so by default
    it is off while the generator sends (a collection forced meanwhile is still reported) and
    on again after; ``collect=True`` leaves it running, as the floor benchmark's "running"
    way measures it."""
    seen: list[bool] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(gc.isenabled())
        if len(seen) == 1:
            gc.collect()
        return web.json_response({"id": "x"}, status=202)

    assert gc.isenabled()
    async with _answering(answer) as url:
        result = await open_loop(url, [0.0, 0.01, 0.02], lambda n: {"n": n}, collect=collect)
    assert len(result.accepted) == 3
    assert seen == [collect] * 3
    assert gc.isenabled()
    assert result.collector.full >= 1


@contextlib.asynccontextmanager
async def _answering(handler: Any) -> AsyncIterator[str]:
    """An aiohttp server answering ``POST /v1/requests`` with ``handler``: its URL."""
    app = web.Application()
    app.router.add_post("/v1/requests", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
