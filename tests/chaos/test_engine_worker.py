"""An engine worker killed mid-generation: what had not finished runs again, exactly once."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from batchserve.testing.deployment import Stack
from tests.chaos.conftest import exactly_once
from tests.support.live import db_rows, wait_terminal
from tests.support.streams import assembled, sse_events

SMOL = "smollm2-135m"  # an engine of 32 sequences in the test registry
# The first shorts end at token 8 and the waiting take their room; the kill comes soon after
# (13 pieces into the followed long one on an Intel Xeon, 2-3 steps after the 32 are running),
# before any long one ends. What had not finished then runs again in isolation groups (each
# killed batch in halves), one group at a time, each as long as its longest: with 64-token longs
# that took 57 s of a 117 s test on 2 cores; with 40 on a loaded AMD EPYC, where a step alone
# took 0.45 s, ten groups ran past the test's 300 s. 24 keeps a margin on both sides.
SHORT_TOKENS, LONG_TOKENS = 8, 24


def tokens(n: int) -> int:
    """A third are short: they finish early and the waiting ones take their room."""
    return SHORT_TOKENS if n % 3 == 0 else LONG_TOKENS


async def follow(http: httpx.AsyncClient, request_id: str, lines: list[str]) -> None:
    """Read the request's stream to its end, its lines into ``lines`` as they come."""
    async with http.stream("GET", f"/v1/requests/{request_id}/stream", timeout=600) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            lines.append(line)


@pytest.mark.timeout(480)  # the recovery runs its isolation groups one after another
async def test_sigkill_with_32_sequences_running_loses_and_repeats_nothing(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start("worker", "worker", "--model", SMOL)
    stack.start_api()
    stack.wait_slots(SMOL, 32)
    bodies = [
        {
            "model": SMOL,
            "messages": [{"role": "user", "content": f"Tell me a long story, number {n}."}],
            "params": {"max_tokens": tokens(n), "temperature": 0, "ignore_eos": True},
        }
        for n in range(48)
    ]
    responses = await asyncio.gather(*(http.post("/v1/requests", json=b) for b in bodies))
    assert all(r.status_code == 202 for r in responses), [r.text for r in responses][:2]
    ids = [r.json()["id"] for r in responses]

    # Until some have finished and the engine holds a full 32 again, mid-generation.
    give_up = time.monotonic() + 180
    while time.monotonic() < give_up:
        counts = dict(db_rows(stack, "SELECT state, count(*) FROM requests GROUP BY state"))
        if counts.get("succeeded", 0) >= 8 and counts.get("running", 0) >= 32:
            break
        await asyncio.sleep(0.1)
    assert counts.get("running") == 32, counts  # never more than the engine holds
    await asyncio.sleep(1.0)
    before = {
        str(r[0]): r[1]
        for r in db_rows(stack, "SELECT id, output FROM requests WHERE state = 'succeeded'")
    }
    # A client follows one long answer across the kill, from its first pieces.
    (followed,) = db_rows(
        stack,
        "SELECT id FROM requests WHERE state = 'running' AND max_tokens = :long "
        "ORDER BY created_at LIMIT 1",
        long=LONG_TOKENS,
    )[0]
    lines: list[str] = []
    following = asyncio.create_task(follow(http, str(followed), lines))
    give_up = time.monotonic() + 30
    while "event: delta" not in lines and time.monotonic() < give_up:
        await asyncio.sleep(0.05)
    assert "event: delta" in lines
    pieces_at_kill = lines.count("event: delta")  # how far into its tokens the kill came
    killed_at = time.time()
    stack.kill("worker")  # SIGKILL: the engine and every sequence in it die at once
    in_flight = {
        str(r[0]) for r in db_rows(stack, "SELECT id FROM requests WHERE state = 'running'")
    }
    assert len(in_flight) == 32
    stack.start("worker")

    results = await wait_terminal(http, ids, timeout_s=600)
    recovered_s = time.time() - killed_at
    print(
        f"\n32 sequences killed mid-generation (the followed one {pieces_at_kill} pieces of "
        f"{LONG_TOKENS} in); all 48 done {recovered_s:.1f} s after the kill"
    )
    assert {r["status"] for r in results.values()} == {"succeeded"}
    for n, request_id in enumerate(ids):
        assert results[request_id]["usage"]["completion_tokens"] == tokens(n)
    for request_id, output in before.items():
        # What had finished before the kill was not run again, nor its answer touched.
        assert results[request_id]["attempts"] == 1
        assert results[request_id]["output"]["text"] == output
    for request_id in in_flight:  # what was running ran again (a dispatch more, at least)
        assert results[request_id]["attempts"] >= 2
    # The streams end with the stored answers: the killed runs' text was started over.
    await asyncio.wait_for(following, 60)
    seen = list(sse_events(lines))
    assert "reset" in [e.event for e in seen]
    assert assembled(seen) == results[str(followed)]["output"]["text"]
    for request_id in in_flight:
        replay = await http.get(f"/v1/requests/{request_id}/stream")
        events = list(sse_events(replay.text.splitlines()))
        assert assembled(events) == results[request_id]["output"]["text"], request_id
    report = exactly_once(stack, ids)
    assert report.lost == 0 and report.duplicated == 0
    crashed = db_rows(stack, "SELECT count(*) FROM batches WHERE outcome = 'crashed'")[0][0]
    assert crashed >= 1
