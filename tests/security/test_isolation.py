"""Tenant isolation and authentication, as an outside tester tried them (issue 21): every
``/v1`` route refuses a missing, unknown or non-Bearer key, and no resource of one tenant
(request, its deliveries, file, file content, batch, webhook secret, idempotency key) is
visible to or changeable by another."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from fastapi import FastAPI

from batchserve.core.settings import Settings
from tests.support import keys
from tests.support.inprocess import asgi_client, running_app, tenant_settings

ECHO = "echo-100ms"
CHAT = "/v1/chat/completions"
LINE = orjson.dumps(
    {
        "custom_id": "c0",
        "method": "POST",
        "url": CHAT,
        "body": {"model": ECHO, "messages": [{"role": "user", "content": "m0"}]},
    }
)


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    async with running_app(tenant_settings(settings)) as application:
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app, authed=False) as http:
        yield http


async def test_every_v1_route_needs_a_valid_key(app: FastAPI, client: httpx.AsyncClient) -> None:
    operations = [
        (method.upper(), path)
        for path, methods in app.openapi()["paths"].items()
        if path.startswith("/v1")
        for method in methods
    ]
    assert len(operations) >= 20
    fake_id = str(uuid.uuid4())
    for method, template in operations:
        path = template.replace("{request_id}", fake_id).replace("{delivery_id}", "msg_x")
        path = path.replace("{model_id}", ECHO).replace("{batch_id}", "batch_x")
        path = path.replace("{file_id}", "file-x")
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic eDp5"}):
            response = await client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
    # Health, readiness and the schema stay open.
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/openapi.json")).status_code == 200


async def test_one_tenant_never_sees_another_tenants_resources(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    alice, bob = keys.auth("alice"), keys.auth("bob")
    idem = {"Idempotency-Key": "shared-key"}
    request = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "a"}, headers=alice | idem
    )
    assert request.status_code == 202
    request_id = request.json()["id"]
    uploaded = await client.post(
        "/v1/files",
        files={"file": ("in.jsonl", LINE)},
        data={"purpose": "batch"},
        headers=alice,
    )
    file_id = uploaded.json()["id"]
    job = await client.post(
        "/v1/batches",
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
        headers=alice,
    )
    assert job.status_code == 200, job.text
    batch_id = job.json()["id"]
    secret = await client.post("/v1/webhooks/secret", headers=alice)
    assert secret.status_code == 201

    for method, path in [
        ("GET", f"/v1/requests/{request_id}"),
        ("POST", f"/v1/requests/{request_id}/cancel"),
        ("GET", f"/v1/requests/{request_id}/deliveries"),
        ("GET", f"/v1/files/{file_id}"),
        ("GET", f"/v1/files/{file_id}/content"),
        ("DELETE", f"/v1/files/{file_id}"),
        ("GET", f"/v1/batches/{batch_id}"),
        ("POST", f"/v1/batches/{batch_id}/cancel"),
        ("GET", "/v1/webhooks/secret"),
    ]:
        response = await client.request(method, path, headers=bob)
        assert response.status_code == 404, (method, path, response.text)
    assert (await client.get("/v1/requests", headers=bob)).json()["data"] == []
    assert (await client.get("/v1/batches", headers=bob)).json()["data"] == []
    assert (await client.get("/v1/files", headers=bob)).json()["data"] == []
    # Bob's use of the same Idempotency-Key is his own request, not a replay of Alice's.
    own = await client.post("/v1/requests", json={"model": ECHO, "input": "b"}, headers=bob | idem)
    assert own.status_code == 202 and "idempotent-replayed" not in own.headers
    assert own.json()["id"] != request_id
    # And Alice still sees hers, untouched.
    mine = await client.get(f"/v1/requests/{request_id}", headers=alice)
    assert mine.status_code == 200 and mine.json()["status"] == "queued"
    assert (await client.get(f"/v1/files/{file_id}", headers=alice)).status_code == 200
    assert [f["id"] for f in (await client.get("/v1/files", headers=alice)).json()["data"]] == [
        file_id
    ]
