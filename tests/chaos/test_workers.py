"""Workers dying or freezing mid-batch: only unfinished requests run again, exactly once each."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import httpx

from batchserve.testing.deployment import Stack
from batchserve.testing.faults import freeze
from tests.chaos.conftest import exactly_once, submit_many, wait_for_running_batch
from tests.support.live import db_rows, wait_terminal

SLOW = "echo-slow"  # 1 s batches: time to kill a worker in the middle of one


def start(stack: Stack, *workers: str) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    for name in workers:
        stack.start(name, "worker", "--model", SLOW, "--slots", "1")
    stack.start_api()
    stack.wait_slots(SLOW, len(workers))


def batch_outcome(stack: Stack, batch_id: str) -> str | None:
    return db_rows(stack, "SELECT outcome FROM batches WHERE id = :b", b=batch_id)[0][0]


async def test_killing_the_pool_process_mid_batch_reruns_only_that_batch(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    start(stack, "worker")
    ids = await submit_many(http, SLOW, [f"r{i}" for i in range(40)])
    running = wait_for_running_batch(stack, SLOW)
    worker = db_rows(stack, "SELECT worker FROM batches WHERE id = :b", b=running)[0][0]
    # The pool process running the batch; its standby (a second process per slot, which may
    # hold the next batch's lease) lives on and runs the next batch.
    (pid,) = [p for p in stack.child_pids("worker") if worker.endswith(f":{p}")]
    os.kill(pid, signal.SIGKILL)
    results = await wait_terminal(http, ids, timeout_s=90)
    assert all(r["status"] == "succeeded" for r in results.values())
    assert batch_outcome(stack, running) == "crashed"
    rerun = [r for r in results.values() if r["attempts"] > 1]
    members = db_rows(stack, "SELECT size FROM batches WHERE id = :b", b=running)[0][0]
    assert 0 < len(rerun) <= members  # only the crashed batch's requests ran again
    exactly_once(stack, ids)


async def test_killing_the_worker_main_process_mid_batch(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    start(stack, "worker")
    ids = await submit_many(http, SLOW, [f"r{i}" for i in range(20)])
    running = wait_for_running_batch(stack, SLOW)
    children = stack.child_pids("worker")
    stack.kill("worker")
    for pid in children:  # an orphaned pool process would finish its batch: the point is death
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stack.start("worker")
    results = await wait_terminal(http, ids, timeout_s=90)
    assert all(r["status"] == "succeeded" for r in results.values())
    assert batch_outcome(stack, running) == "crashed"
    exactly_once(stack, ids)


async def test_a_worker_frozen_past_its_lease_is_reaped_and_its_late_write_discarded(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    start(stack, "worker-a", "worker-b")
    ids = await submit_many(http, SLOW, [f"r{i}" for i in range(20)])
    running = wait_for_running_batch(stack, SLOW)
    worker = db_rows(stack, "SELECT worker FROM batches WHERE id = :b", b=running)[0][0]
    pids_a = [stack.roles["worker-a"].pid, *stack.child_pids("worker-a")]
    frozen = "worker-a" if any(worker.endswith(f":{pid}") for pid in pids_a) else "worker-b"
    freeze(stack, frozen, seconds=4.0)  # lease 1 s: reaped, requeued, run by the other worker
    results = await wait_terminal(http, ids, timeout_s=90)
    assert all(r["status"] == "succeeded" for r in results.values())
    assert batch_outcome(stack, running) == "crashed"
    assert all(r["batch_id"] != running for r in results.values())
    time.sleep(1.5)  # the frozen worker woke up and tried to write its stale results
    assert "batch_result_discarded" in stack.logs(frozen) or "batch_skipped" in stack.logs(frozen)
    exactly_once(stack, ids)
