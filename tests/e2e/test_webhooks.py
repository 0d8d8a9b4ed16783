"""Webhooks on real processes: API -> batcher -> Celery worker -> outbox -> ``batchserve
webhooks`` -> a real receiver, and a webhooks process killed in the middle of an attempt."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from standardwebhooks import Webhook

from batchserve.testing.deployment import Stack
from tests.support import keys
from tests.support.webhook_receiver import Receiver, Reply

ECHO = "echo-100ms"
WEBHOOK_ENV = {
    "BATCHSERVE_WEBHOOK_ALLOWLIST": "127.0.0.1",
    "BATCHSERVE_SECRET_KEY": Fernet.generate_key().decode(),
    "BATCHSERVE_WEBHOOK_TIMEOUT_S": "4",
    "BATCHSERVE_WEBHOOK_LEASE_S": "5",
    "BATCHSERVE_WEBHOOK_CONCURRENCY": "4",
}


@pytest.fixture
def hooks_stack(stack: Stack) -> Stack:
    stack.env = {**stack.env, **WEBHOOK_ENV}
    return stack


@pytest.fixture
async def client(hooks_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=hooks_stack.url, timeout=30, headers=keys.auth()) as http:
        yield http


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = Receiver()
    await server.start()
    yield server
    await server.stop()


async def delivery_of(client: httpx.AsyncClient, request_id: str, status: str) -> dict[str, Any]:
    give_up = time.monotonic() + 30
    while True:
        data = (await client.get(f"/v1/requests/{request_id}/deliveries")).json()["data"]
        if data and data[0]["status"] == status:
            return dict(data[0])
        assert time.monotonic() < give_up, data
        await asyncio.sleep(0.1)


async def test_each_result_reaches_the_receiver_exactly_once_signed(
    hooks_stack: Stack, client: httpx.AsyncClient, receiver: Receiver
) -> None:
    hooks_stack.start("webhooks", "webhooks")
    hooks_stack.start_all({ECHO: 1})
    secret = (await client.post("/v1/webhooks/secret")).json()["secret"]
    texts = [f"webhook {i}" for i in range(5)]
    ids = []
    for text in texts:
        body = {"model": ECHO, "input": text, "webhook_url": receiver.url()}
        response = await client.post("/v1/requests", json=body)
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    received = await receiver.wait_for(5)
    events = [Webhook(secret).verify(r.body, r.headers) for r in received]
    assert {e["data"]["id"]: e["data"]["output"]["text"] for e in events} == dict(
        zip(ids, texts, strict=True)
    )
    assert all(e["type"] == "request.succeeded" for e in events)
    deliveries = [await delivery_of(client, i, "delivered") for i in ids]
    assert sorted(d["id"] for d in deliveries) == sorted(r.headers["webhook-id"] for r in received)
    assert all(len(d["attempts"]) == 1 for d in deliveries)
    assert len(receiver.received) == 5  # once each, recorded delivered


async def test_a_webhooks_process_killed_mid_attempt_still_delivers_under_the_same_id(
    hooks_stack: Stack, client: httpx.AsyncClient, receiver: Receiver
) -> None:
    hooks_stack.start_api()
    hooks_stack.start("webhooks", "webhooks")
    held = asyncio.Event()
    receiver.script = [Reply(200, hold=held)]
    body = {"model": ECHO, "input": "survive", "webhook_url": receiver.url()}
    request_id = (await client.post("/v1/requests", json=body)).json()["id"]
    assert (await client.post(f"/v1/requests/{request_id}/cancel")).status_code == 200
    (first,) = await receiver.wait_for(1)  # the attempt is in flight, its answer held back
    hooks_stack.kill("webhooks")
    held.set()
    hooks_stack.start("webhooks")
    _, second = await receiver.wait_for(2, timeout_s=30)
    assert second.headers["webhook-id"] == first.headers["webhook-id"]
    delivery = await delivery_of(client, request_id, "delivered")
    first_attempt, second_attempt = delivery["attempts"]
    assert first_attempt["status_code"] is None and "stopped" in first_attempt["error"]
    assert second_attempt["status_code"] == 200
    assert len(receiver.received) == 2
    assert os.path.exists(hooks_stack.roles["webhooks"].log_path)
