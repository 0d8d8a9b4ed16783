"""Races an outside tester tried (issue 21): the same idempotency key sent at once, one key by
two tenants, and a request cancelled by many callers at once. Each ends with one request and,
once terminal, exactly one terminal event."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import func, select

from batchserve.core.tables import RequestEvent
from tests.security.conftest import stored_requests
from tests.support import keys


def body(**overrides: Any) -> dict[str, Any]:
    return {"model": "echo-100ms", "input": "hello", **overrides}


async def test_concurrent_same_key_admits_once(client: httpx.AsyncClient, app: FastAPI) -> None:
    headers = {"Idempotency-Key": "burst"}
    responses = await asyncio.gather(
        *(client.post("/v1/requests", json=body(), headers=headers) for _ in range(20))
    )
    codes = sorted(r.status_code for r in responses)
    assert set(codes) <= {202, 409}
    ids = {r.json()["id"] for r in responses if r.status_code == 202}
    assert len(ids) == 1
    assert await stored_requests(app) == 1


async def test_idempotency_keys_are_scoped_to_the_caller(client: httpx.AsyncClient) -> None:
    headers = {"Idempotency-Key": "same"}
    alice = await client.post(
        "/v1/requests", json=body(), headers={**headers, **keys.auth("alice")}
    )
    bob = await client.post("/v1/requests", json=body(), headers={**headers, **keys.auth("bob")})
    assert alice.status_code == bob.status_code == 202
    assert alice.json()["id"] != bob.json()["id"]
    assert (
        await client.get(f"/v1/requests/{alice.json()['id']}", headers=keys.auth("bob"))
    ).status_code == 404


async def test_twenty_cancels_at_once_end_a_request_once(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    made = await client.post("/v1/requests", json=body())
    request_id = made.json()["id"]
    responses = await asyncio.gather(
        *(client.post(f"/v1/requests/{request_id}/cancel") for _ in range(20))
    )
    assert {r.status_code for r in responses} == {200}, [r.text for r in responses]
    assert {r.json()["status"] for r in responses} == {"cancelled"}
    store = app.state.services.adapters.store
    async with store.engine.connect() as conn:
        events = (
            await conn.execute(
                select(RequestEvent.state, func.count())
                .where(RequestEvent.request_id == uuid.UUID(request_id))
                .group_by(RequestEvent.state)
            )
        ).all()
    assert [tuple(e) for e in events] == [("cancelled", 1)]
