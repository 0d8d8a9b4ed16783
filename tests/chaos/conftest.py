"""Chaos tests: real processes killed, frozen and restarted; every accepted request counted.

Each test ends by auditing, from Postgres, that every request it got a 202 for reached exactly
one terminal state: none lost, none stuck, none answered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchserve.testing.chaos import ChaosReport, audit, states
from batchserve.testing.deployment import Stack
from batchserve.testing.faults import start_postgres, start_rabbitmq, start_redis
from tests.conftest import registered_test_models, server_env
from tests.support import keys
from tests.support.live import db_rows
from tests.support.servers import delete_namespace_queues

# Short leases so a dead worker is noticed in about a second.
UNSETTLED = {"lost", "queued", "dispatched", "running"}
CHAOS_ENV = {"BATCHSERVE_LEASE_S": "1.0", "BATCHSERVE_REPUBLISH_AFTER_S": "1"}


@pytest.fixture
def stack(database_url: str, namespace: str, tmp_path: Path) -> Iterator[Stack]:
    with chaos_stack(database_url, namespace, tmp_path) as deployment:
        yield deployment


@contextlib.contextmanager
def chaos_stack(
    database_url: str, namespace: str, log_dir: Path, **overrides: str
) -> Iterator[Stack]:
    """A deployment with short leases on ``database_url`` (and ``overrides`` of its
    environment); its roles killed at the end and the shared servers left running."""
    env = {**os.environ, **server_env(database_url, namespace, **overrides), **CHAOS_ENV}
    deployment = Stack(env=env, log_dir=log_dir, keys={"tests": keys.key()})
    try:
        yield deployment
    finally:
        deployment.discard()
        # Whatever a test did to the servers, leave them running.
        start_postgres()
        start_redis()
        start_rabbitmq_if_down()
        delete_namespace_queues(namespace, registered_test_models())


def start_rabbitmq_if_down() -> None:
    from batchserve.testing.faults import port_open

    if not port_open(5672):
        start_rabbitmq()


async def submit_many(
    http: httpx.AsyncClient, model: str, texts: list[str], **extra: Any
) -> list[str]:
    responses = await asyncio.gather(
        *(http.post("/v1/requests", json={"model": model, "input": t, **extra}) for t in texts)
    )
    assert all(r.status_code == 202 for r in responses), [
        r.text for r in responses if r.status_code != 202
    ][:3]
    return [r.json()["id"] for r in responses]


def wait_for_running_batch(stack: Stack, model: str, timeout_s: float = 30.0) -> str:
    """The id of a batch of ``model`` a worker has started and not finished: the one leased
    first (a standby process may hold the next one's lease, waiting for the slot)."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        rows = db_rows(
            stack,
            "SELECT id FROM batches"
            " WHERE model = :m AND started_at IS NOT NULL AND outcome IS NULL"
            " ORDER BY started_at LIMIT 1",
            m=model,
        )
        if rows:
            return str(rows[0][0])
        time.sleep(0.05)
    raise AssertionError(f"no running batch of {model} within {timeout_s}s")


def exactly_once(stack: Stack, accepted: list[str], settle_s: float = 60.0) -> ChaosReport:
    """Audit the accepted requests once they have settled; fail on any lost, stuck or twice."""
    url = stack.env["BATCHSERVE_DATABASE_URL"]
    give_up = time.monotonic() + settle_s
    report = audit(url, accepted)
    while report.stuck and time.monotonic() < give_up:
        time.sleep(0.5)
        report = audit(url, accepted)
    if not report.clean:
        found = states(url, accepted)
        unsettled = [(i, found.get(i)) for i in accepted if found.get(i, ("lost",))[0] in UNSETTLED]
        raise AssertionError("\n".join([*report.lines(), f"unsettled: {unsettled[:5]}"]))
    return report


ECHO = "echo-100ms"


def fault_body(i: int) -> dict[str, object]:
    return {"model": ECHO, "input": f"under fault {i}", "timeout_s": 300}


async def traffic(stack: Stack, rate: float, seconds: float, seed: int) -> list[str]:
    """Open-loop Poisson submits of the echo model at ``rate`` for ``seconds``: the ids
    accepted."""
    from batchserve.bench.loadgen import open_loop, poisson_schedule

    result = await open_loop(
        stack.url, poisson_schedule(rate, seconds, seed), fault_body, headers=keys.auth()
    )
    return [s.request_id for s in result.accepted if s.request_id]
