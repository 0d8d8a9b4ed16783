"""A request that breaks every batch it joins is cornered by halving; the others still succeed."""

from __future__ import annotations

import math
import re
from typing import Any

import httpx

from batchserve.testing.deployment import Stack
from tests.chaos.conftest import exactly_once, submit_many
from tests.support.live import db_rows, wait_terminal

FAULTY = "faulty"  # faulty backend: [[raise]], [[crash]], [[stall]], [[item-error]] markers
BATCH = 32
BUDGET = 3  # failures a request may be charged (settings.max_failures)


async def one_batch_with(
    stack: Stack, http: httpx.AsyncClient, marker: str, size: int
) -> tuple[str, list[str]]:
    """Submit ``size`` requests, one carrying ``marker``, so that they leave as one batch."""
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start_api()
    texts = [f"fine {i}" for i in range(size - 1)] + [f"culprit {marker}"]
    ids = await submit_many(http, FAULTY, texts)
    stack.start("worker", "worker", "--model", FAULTY, "--slots", "1")  # one batch of them all
    return ids[-1], ids[:-1]


def check(results: dict[str, dict[str, Any]], culprit: str, innocent: list[str]) -> None:
    assert all(results[i]["status"] == "succeeded" for i in innocent)
    assert results[culprit]["status"] == "failed"
    assert results[culprit]["error"]["code"] == "poison"


async def test_a_request_that_makes_its_batch_raise(stack: Stack, http: httpx.AsyncClient) -> None:
    culprit, innocent = await one_batch_with(stack, http, "[[raise]]", BATCH)
    results = await wait_terminal(http, [culprit, *innocent], timeout_s=90)
    check(results, culprit, innocent)
    runs = [int(n) for n in re.findall(r"size=32 model_ms=\S+ runs=(\d+)", stack.logs("worker"))]
    assert runs and runs[0] <= 1 + 2 * math.log2(BATCH), runs  # halving: at most 2 per level
    assert results[culprit]["attempts"] == BUDGET  # then alone, until its budget is spent
    exactly_once(stack, [culprit, *innocent])


async def test_a_request_that_crashes_the_worker_process(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    culprit, innocent = await one_batch_with(stack, http, "[[crash]]", BATCH)
    results = await wait_terminal(http, [culprit, *innocent], timeout_s=180)
    check(results, culprit, innocent)
    crashed = db_rows(stack, "SELECT count(*) FROM batches WHERE outcome = 'crashed'")[0][0]
    # One crash per halving level, then its budget alone: about log2(batch) + budget.
    assert crashed <= math.log2(BATCH) + BUDGET, crashed
    # Batches that ran: one handed to the crashed process but never started there is requeued
    # whole (outcome abandoned) and costs no model time.
    outcomes = dict(
        db_rows(stack, "SELECT coalesce(outcome, 'open'), count(*) FROM batches GROUP BY 1")
    )
    ran = db_rows(stack, "SELECT count(*) FROM batches WHERE started_at IS NOT NULL")[0][0]
    assert ran - 1 <= 2 * math.log2(BATCH) + BUDGET, outcomes  # extra batches for one culprit
    exactly_once(stack, [culprit, *innocent])


async def test_a_request_that_stalls_its_batch(stack: Stack, http: httpx.AsyncClient) -> None:
    culprit, innocent = await one_batch_with(stack, http, "[[stall]]", 4)
    results = await wait_terminal(http, [culprit, *innocent], timeout_s=180)
    check(results, culprit, innocent)
    exactly_once(stack, [culprit, *innocent])


async def test_a_per_item_model_error_fails_only_that_item(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    culprit, innocent = await one_batch_with(stack, http, "[[item-error]]", 8)
    results = await wait_terminal(http, [culprit, *innocent], timeout_s=60)
    assert all(results[i]["status"] == "succeeded" for i in innocent)
    assert results[culprit]["status"] == "failed"
    assert results[culprit]["error"]["code"] == "model_error"
    assert results[culprit]["attempts"] == 1  # not retried: the model answered, with an error
    exactly_once(stack, [culprit, *innocent])
