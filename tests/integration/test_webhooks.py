"""Webhooks end to end in one process: the real app on Postgres, the relay and sender on this
event loop, and a real receiver on 127.0.0.1 that verifies with the ``standardwebhooks`` library.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from cryptography.fernet import Fernet
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import select
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from batchserve.api.main import create_app
from batchserve.core.domain import ItemResult, Timings
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.core.ssrf import Allowlist, IPAddress, UrlGuard
from batchserve.core.store import BatchStart, ItemOutcome, JobStore
from batchserve.core.tables import secrets_table
from batchserve.workers.webhooks.delivery import create_deliverer
from batchserve.workers.webhooks.relay import InProcessSenders, Relay
from batchserve.workers.webhooks.sender import WebhookSender
from tests.support import keys
from tests.support.tls import self_signed
from tests.support.webhook_receiver import Received, Receiver, Reply

SERVER_KEY = Fernet.generate_key().decode()
GRACE_S = 120.0


class Clock:
    """Wall time, shifted on demand (to step past a rotation's grace period)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


@pytest.fixture
def wh_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "webhook_allowlist": "127.0.0.1",
            "webhook_retry_schedule": "0.6,1.2",
            "webhook_timeout_s": 3.0,
            "webhook_lease_s": 5.0,
            "webhook_secret_grace_s": GRACE_S,
            "secret_key": SecretStr(SERVER_KEY),
        }
    )


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://test", headers=keys.auth()
        ) as client:
            yield app, client


@pytest.fixture
async def api(wh_settings: Settings) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with serving(wh_settings) as served:
        yield served


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = Receiver()
    await server.start()
    yield server
    await server.stop()


@contextlib.asynccontextmanager
async def relaying(
    store: JobStore, settings: Settings, clock: Clock, guard: UrlGuard | None = None
) -> AsyncIterator[None]:
    """The webhooks role, in process: relay and senders on this loop (as the embedded mode)."""
    deliverer = create_deliverer(store, settings, clock=clock, guard=guard)
    senders = InProcessSenders(deliverer, concurrency=8)
    relay = Relay(store=store, senders=senders, lease_s=5.0, tick_s=0.05, clock=clock)
    task = asyncio.create_task(relay.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await senders.close()
        await deliverer.close()


@pytest.fixture
async def clock(
    api: tuple[FastAPI, httpx.AsyncClient], wh_settings: Settings
) -> AsyncIterator[Clock]:
    wall = Clock()
    async with relaying(store_of(api[0]), wh_settings, wall):
        yield wall


def store_of(app: FastAPI) -> JobStore:
    return app.state.services.adapters.store


async def submit(client: httpx.AsyncClient, webhook_url: str | None, text: str = "hi") -> str:
    body: dict[str, Any] = {"model": "echo-100ms", "input": text}
    if webhook_url is not None:
        body["webhook_url"] = webhook_url
    response = await client.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def finish(store: JobStore, ids: list[str]) -> None:
    """Run the requests through a batch, as a worker would: each answers its own input."""
    now = time.time()
    batch_id = uuid7()
    claimed = await store.claim_batch(
        batch_id=batch_id,
        model="echo-100ms",
        request_ids=ids,
        now=now,
        estimated_s=0.1,
        lease_until=now + 30,
    )
    start = await store.start_batch(batch_id, "test-worker", now, 30.0)
    assert isinstance(start, BatchStart)
    outcomes = [
        ItemOutcome(
            ItemResult(request_id=c.id, output=c.input, prompt_tokens=1, completion_tokens=1),
            Timings(1.0, 1.0, 1.0, 3.0),
        )
        for c in claimed
    ]
    await store.complete_batch(
        batch_id, attempt=start.attempt, outcomes=outcomes, now=time.time(), model_ms=1.0
    )


async def new_secret(client: httpx.AsyncClient) -> str:
    response = await client.post("/v1/webhooks/secret")
    assert response.status_code == 201, response.text
    return str(response.json()["secret"])


async def wait_delivery(
    client: httpx.AsyncClient, request_id: str, status: str, timeout_s: float = 20.0
) -> dict[str, Any]:
    give_up = time.monotonic() + timeout_s
    while True:
        deliveries = (await client.get(f"/v1/requests/{request_id}/deliveries")).json()["data"]
        if deliveries and deliveries[0]["status"] == status:
            return dict(deliveries[0])
        assert time.monotonic() < give_up, f"delivery not {status}: {deliveries}"
        await asyncio.sleep(0.05)


def verify(secret: str, received: Received) -> Any:
    return Webhook(secret).verify(received.body, received.headers)


async def test_a_result_is_delivered_once_signed_and_verifiable(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    app, client = api
    secret = await new_secret(client)
    request_id = await submit(client, receiver.url(), text="deliver me")
    silent_id = await submit(client, None)
    await finish(store_of(app), [request_id, silent_id])
    (received,) = await receiver.wait_for(1)
    event = verify(secret, received)
    assert event["type"] == "request.succeeded"
    assert event["data"] == (await client.get(f"/v1/requests/{request_id}")).json()
    assert event["data"]["output"]["text"] == "deliver me"
    assert received.headers["user-agent"] == "batchserve-webhooks/0.1"
    assert received.headers["content-type"] == "application/json"
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(
            received.body.replace(b"deliver me", b"deliver us"), received.headers
        )
    delivery = await wait_delivery(client, request_id, "delivered")
    assert delivery["id"] == received.headers["webhook-id"] and delivery["id"].startswith("msg_")
    assert [a["status_code"] for a in delivery["attempts"]] == [200]
    assert delivery["event_type"] == "request.succeeded" and delivery["next_attempt_at"] is None
    assert len(receiver.received) == 1
    assert (await client.get(f"/v1/requests/{silent_id}/deliveries")).json()["data"] == []


async def test_failed_attempts_are_retried_on_the_schedule_under_one_id(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    _, client = api
    secret = await new_secret(client)
    receiver.script = [Reply(500), Reply(500), Reply(200)]
    request_id = await submit(client, receiver.url())
    await client.post(f"/v1/requests/{request_id}/cancel")
    attempts = await receiver.wait_for(3)
    assert len({a.headers["webhook-id"] for a in attempts}) == 1
    for attempt in attempts:
        assert verify(secret, attempt)["type"] == "request.cancelled"
        stamp = int(attempt.headers["webhook-timestamp"])
        # Fresh on every attempt: whole seconds, truncated when the attempt is signed (up to
        # 1 s before its send), and up to a second of a busy machine between send and receipt.
        assert attempt.wall - 2 < stamp <= attempt.wall + 1
    # Schedule 0.6 s then 1.2 s, +-10 % jitter; generous for a busy 2-core machine.
    first_gap = attempts[1].monotonic - attempts[0].monotonic
    second_gap = attempts[2].monotonic - attempts[1].monotonic
    assert 0.5 <= first_gap <= 1.5, first_gap
    assert 1.05 <= second_gap <= 2.3, second_gap
    # 1.8 s apart: the timestamps, and so the signatures, differ.
    assert attempts[2].headers["webhook-timestamp"] != attempts[0].headers["webhook-timestamp"]
    assert attempts[2].headers["webhook-signature"] != attempts[0].headers["webhook-signature"]
    delivery = await wait_delivery(client, request_id, "delivered")
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]
    assert delivery["attempts"][0]["error"] == "HTTP 500: ok"


async def test_a_429_retry_after_is_honoured(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    _, client = api
    receiver.script = [Reply(429, {"Retry-After": "2"}), Reply(200)]
    request_id = await submit(client, receiver.url())
    await client.post(f"/v1/requests/{request_id}/cancel")
    first, second = await receiver.wait_for(2)
    assert second.monotonic - first.monotonic >= 1.9  # the schedule alone would say 0.6 s
    await wait_delivery(client, request_id, "delivered")


async def test_410_disables_the_endpoint_until_it_is_enabled_again(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    _, client = api
    receiver.script = [Reply(410)]
    url = receiver.url("/gone")
    first_id = await submit(client, url)
    await client.post(f"/v1/requests/{first_id}/cancel")
    failed = await wait_delivery(client, first_id, "failed")
    assert [a["status_code"] for a in failed["attempts"]] == [410]  # not retried
    # Later events for that URL are not sent at all while it is disabled.
    second_id = await submit(client, url)
    await client.post(f"/v1/requests/{second_id}/cancel")
    skipped = await wait_delivery(client, second_id, "failed")
    assert skipped["attempts"] == [] and "410" in skipped["error"]
    assert len(receiver.received) == 1
    redeliver = f"/v1/requests/{second_id}/deliveries/{skipped['id']}/redeliver"
    refused = await client.post(redeliver)
    assert refused.status_code == 409 and refused.json()["code"] == "invalid_state"
    enabled = await client.post("/v1/webhooks/endpoints/enable", json={"url": url})
    assert enabled.json() == {
        "object": "webhook_endpoint",
        "url": url,
        "enabled": True,
        "was_disabled": True,
    }
    assert (await client.post(redeliver)).status_code == 202
    (_, again) = await receiver.wait_for(2)
    assert again.headers["webhook-id"] == skipped["id"]
    await wait_delivery(client, second_id, "delivered")


async def test_rotation_signs_with_both_secrets_during_the_grace_only(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    _, client = api
    old = await new_secret(client)
    rotated = await client.post("/v1/webhooks/secret/rotate")
    assert rotated.status_code == 200
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != old
    assert rotated.json()["previous_expires_at"] is not None
    during = await submit(client, receiver.url())
    await client.post(f"/v1/requests/{during}/cancel")
    (signed_twice,) = await receiver.wait_for(1)
    assert len(signed_twice.headers["webhook-signature"].split(" ")) == 2
    verify(old, signed_twice)
    verify(new, signed_twice)
    await wait_delivery(client, during, "delivered")
    clock.offset_s = GRACE_S + 1  # past the grace (still within the receivers' 5 min window)
    after = await submit(client, receiver.url())
    await client.post(f"/v1/requests/{after}/cancel")
    (_, signed_once) = await receiver.wait_for(2)
    assert len(signed_once.headers["webhook-signature"].split(" ")) == 1
    verify(new, signed_once)
    with pytest.raises(WebhookVerificationError):
        verify(old, signed_once)


async def test_secret_is_shown_once_and_stored_encrypted(
    api: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    app, client = api
    assert (await client.get("/v1/webhooks/secret")).status_code == 404
    secret = await new_secret(client)
    again = await client.post("/v1/webhooks/secret")
    assert again.status_code == 409 and again.json()["code"] == "already_exists"
    assert again.headers["content-type"].startswith("application/problem+json")
    shown = (await client.get("/v1/webhooks/secret")).json()
    assert shown["secret"] is None and shown["created_at"] and shown["previous_expires_at"] is None
    async with store_of(app).engine.connect() as conn:
        (stored,) = (await conn.execute(select(secrets_table.c.secret_enc))).all()
    assert secret.removeprefix("whsec_") not in stored[0] and "whsec_" not in stored[0]


async def test_deliveries_belong_to_the_callers_tenant(
    api: tuple[FastAPI, httpx.AsyncClient], receiver: Receiver, clock: Clock
) -> None:
    _, client = api
    request_id = await submit(client, receiver.url())
    await client.post(f"/v1/requests/{request_id}/cancel")
    delivery = await wait_delivery(client, request_id, "delivered")
    other = keys.auth("someone-else")
    path = f"/v1/requests/{request_id}/deliveries"
    assert (await client.get(path, headers=other)).status_code == 404
    redeliver = f"{path}/{delivery['id']}/redeliver"
    assert (await client.post(redeliver, headers=other)).status_code == 404
    assert (await client.get(f"/v1/requests/{uuid.uuid4()}/deliveries")).status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/hook",
        "http://localhost:8080/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://100.64.0.1/hook",
        "https://user:secret@example.com/hook",
        "gopher://example.com/",
    ],
)
async def test_urls_into_private_networks_are_refused_at_submission(
    settings: Settings, url: str
) -> None:
    async with serving(settings) as (app, client):  # no allowlist
        response = await client.post(
            "/v1/requests", json={"model": "echo-100ms", "input": "x", "webhook_url": url}
        )
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.json()["field"] == "webhook_url"
        assert await store_of(app).count_by_state() == {}


def resolving(table: dict[str, str]) -> Any:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(table[host])]

    return resolve


async def test_a_name_rebound_to_a_private_address_is_refused_at_delivery(
    settings: Settings, wh_settings: Settings, receiver: Receiver
) -> None:
    url = f"http://rebind.test:{receiver.port}/hook"
    async with serving(settings) as (app, client):
        # Public when the request is submitted...
        app.state.services.url_guard = UrlGuard(
            resolver=resolving({"rebind.test": "93.184.216.34"})
        )
        request_id = await submit(client, url)
        await client.post(f"/v1/requests/{request_id}/cancel")
        # ...loopback when the webhook is sent: nothing leaves, and nothing is retried.
        rebound = UrlGuard(resolver=resolving({"rebind.test": "127.0.0.1"}))
        async with relaying(store_of(app), wh_settings, Clock(), guard=rebound):
            failed = await wait_delivery(client, request_id, "failed")
    (attempt,) = failed["attempts"]
    assert (
        "rebind.test resolves to 127.0.0.1" in attempt["error"] and "loopback" in attempt["error"]
    )
    assert receiver.received == []


async def test_https_goes_to_the_checked_address_with_the_names_host_and_sni(
    tmp_path: Path,
) -> None:
    cert, key = self_signed("hooks.test", tmp_path)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    seen_sni: list[str | None] = []

    def remember_sni(_sock: Any, name: str | None, _ctx: Any) -> None:
        seen_sni.append(name)

    server_context.sni_callback = remember_sni
    receiver = Receiver()
    await receiver.start(ssl_context=server_context)
    client_context = ssl.create_default_context(cafile=str(cert))
    resolver = resolving({"hooks.test": "127.0.0.1"})
    guard = UrlGuard(Allowlist.parse("127.0.0.1/32"), resolver=resolver)

    sender = WebhookSender(guard, timeout_s=5.0, verify=client_context)
    try:
        url = receiver.url("/hook", host="hooks.test", scheme="https")
        outcome = await sender.send(url, {"webhook-id": "msg_x"}, orjson.dumps({"a": 1}))
        assert outcome.status_code == 200 and outcome.address == "127.0.0.1", outcome
        (received,) = receiver.received
        assert received.host == f"hooks.test:{receiver.port}" and seen_sni == ["hooks.test"]
        # Without the allowlist the same name is refused before anything is sent.
        strict = WebhookSender(UrlGuard(resolver=resolver), timeout_s=5.0)
        refused = await strict.send(url, {}, b"{}")
        assert refused.permanent and refused.status_code is None
        await strict.close()
        assert len(receiver.received) == 1
    finally:
        await sender.close()
        await receiver.stop()
