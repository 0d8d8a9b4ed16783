"""Deadlines and cancellation on the live stack: queued past due expires unrun; cancel wins."""

from __future__ import annotations

import asyncio

import httpx

from batchserve.testing.deployment import Stack
from tests.chaos.conftest import exactly_once, submit_many, wait_for_running_batch
from tests.support.live import db_rows, wait_terminal

SLOW = "echo-slow"


def ran(stack: Stack, request_id: str) -> bool:
    """Whether a worker ever started a batch holding this request."""
    rows = db_rows(stack, "SELECT attempts FROM requests WHERE id = :r", r=request_id)
    return bool(rows and rows[0][0] > 0)


async def test_queued_requests_past_their_deadline_expire_without_running(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start_api()  # no worker yet: nothing can run
    short = await submit_many(http, SLOW, [f"short {i}" for i in range(5)], timeout_s=1.5)
    long = await submit_many(http, SLOW, [f"long {i}" for i in range(5)], timeout_s=120)
    results = await wait_terminal(http, short, timeout_s=30)
    assert all(r["status"] == "expired" for r in results.values())
    assert all(r["error"]["code"] == "deadline_exceeded" for r in results.values())
    stack.start("worker", "worker", "--model", SLOW, "--slots", "1")
    done = await wait_terminal(http, long, timeout_s=60)
    assert all(r["status"] == "succeeded" for r in done.values())
    assert not any(ran(stack, i) for i in short)
    exactly_once(stack, short + long)


async def test_cancelled_while_queued_never_runs(stack: Stack, http: httpx.AsyncClient) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start_api()
    ids = await submit_many(http, SLOW, [f"q{i}" for i in range(6)])
    for request_id in ids[:3]:
        response = await http.post(f"/v1/requests/{request_id}/cancel")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
    stack.start("worker", "worker", "--model", SLOW, "--slots", "1")
    results = await wait_terminal(http, ids, timeout_s=60)
    assert [results[i]["status"] for i in ids] == ["cancelled"] * 3 + ["succeeded"] * 3
    assert not any(ran(stack, i) for i in ids[:3])
    exactly_once(stack, ids)


async def test_cancelled_while_running_ends_cancelled_and_its_result_is_discarded(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({SLOW: 1})
    ids = await submit_many(http, SLOW, ["running 1", "running 2"])
    wait_for_running_batch(stack, SLOW)
    response = await http.post(f"/v1/requests/{ids[0]}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    results = await wait_terminal(http, ids, timeout_s=30)
    await asyncio.sleep(0.5)  # the batch has written its results by now
    again = (await http.get(f"/v1/requests/{ids[0]}")).json()
    assert again["status"] == "cancelled" and again["output"] is None
    assert results[ids[1]]["status"] == "succeeded"
    finishing = await http.post(f"/v1/requests/{ids[1]}/cancel")
    assert finishing.status_code == 409  # too late: it finished
    exactly_once(stack, ids)
