"""The HTTP contract, on the real app with Postgres, RabbitMQ and Redis behind it."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from batchserve.core.settings import Settings
from batchserve.core.store import JobStore, advisory_key
from batchserve.core.store.base import NOTIFIED_OUTPUT_MAX_CHARS
from tests.support.batches import complete


def store_of(app: FastAPI) -> JobStore:
    return app.state.services.adapters.store


def count_reads(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> list[uuid.UUID]:
    """The ids ``store.get`` reads from now on, in order."""
    reads: list[uuid.UUID] = []
    read = store.get

    async def counted(request_id: uuid.UUID, tenant: str | None = None) -> Any:
        reads.append(request_id)
        return await read(request_id, tenant)

    monkeypatch.setattr(store, "get", counted)
    return reads


async def count_rows(app: FastAPI) -> int:
    return sum((await store_of(app).count_by_state()).values())


def body(**overrides: Any) -> dict[str, Any]:
    return {"model": "echo-100ms", "input": "hello", **overrides}


async def test_submit_answers_202_with_location_and_persists(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    response = await client.post("/v1/requests", json=body(metadata={"k": "v"}))
    assert response.status_code == 202
    created = response.json()
    assert response.headers["location"] == f"/v1/requests/{created['id']}"
    assert created["status"] == "queued" and created["metadata"] == {"k": "v"}
    fetched = (await client.get(response.headers["location"])).json()
    assert fetched["id"] == created["id"]
    assert await count_rows(app) == 1


@pytest.mark.parametrize(
    ("payload", "status", "field"),
    [
        (body(input=""), 422, "input"),
        ({"model": "echo-100ms"}, 422, "input"),
        (body(messages=[{"role": "user", "content": "x"}]), 422, "messages"),
        (body(messages=[]), 422, "messages"),
        (body(params={"stop": ["a", "b", "c", "d", "e"]}), 422, "params.stop"),
        (body(model="no-such-model"), 404, "model"),
        (body(params={"max_tokens": 0}), 422, "params.max_tokens"),
        (body(params={"max_tokens": 5000}), 422, "params.max_tokens"),
        (body(params={"temperature": "hot"}), 422, "params.temperature"),
        (body(input=123), 422, "input"),
        (body(timeout_s=-1), 422, "timeout_s"),
        (body(timeout_s=10**9), 422, "timeout_s"),
        (body(lane="vip"), 422, "lane"),
        (body(unknown_field=1), 422, "unknown_field"),
        (body(webhook_url="ftp://x"), 422, "webhook_url"),
        (body(metadata={f"k{i}": "v" for i in range(17)}), 422, "metadata"),
    ],
)
async def test_bad_input_is_a_clear_problem_and_creates_nothing(
    client: httpx.AsyncClient, app: FastAPI, payload: dict[str, Any], status: int, field: str
) -> None:
    response = await client.post("/v1/requests", json=payload)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["status"] == status and problem["type"].startswith("urn:batchserve:problem:")
    assert field in (problem.get("field"), *(e["field"] for e in problem.get("errors", [])))
    assert await count_rows(app) == 0


async def test_malformed_json_is_400(client: httpx.AsyncClient, app: FastAPI) -> None:
    response = await client.post(
        "/v1/requests",
        content=b'{"model": "echo-100ms", "input": ',
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == "malformed_json"
    assert await count_rows(app) == 0


async def test_body_over_the_limit_is_413(
    client: httpx.AsyncClient, app: FastAPI, settings: Settings
) -> None:
    response = await client.post(
        "/v1/requests", json=body(input="x" * (settings.max_body_bytes + 10))
    )
    assert response.status_code == 413
    problem = response.json()
    assert problem["field"] == "body" and problem["limit"] == {"max_bytes": settings.max_body_bytes}
    assert await count_rows(app) == 0


async def test_idempotent_replay_conflict_and_in_progress(
    client: httpx.AsyncClient, app: FastAPI, settings: Settings
) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = await client.post("/v1/requests", json=body(), headers=headers)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    # Key order and spacing do not make a different body.
    replay = await client.post(
        "/v1/requests",
        content=b'{ "input": "hello",   "model": "echo-100ms" }',
        headers={**headers, "content-type": "application/json"},
    )
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    other = await client.post("/v1/requests", json=body(input="different"), headers=headers)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    # Another admission (another API process) holding the key: 409 while it lasts.
    tenant = "tests"
    with psycopg.connect(settings.database_url.replace("+psycopg", "")) as held:  # type: ignore[union-attr]
        held.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key(tenant, "order-43"),))
        busy = await client.post(
            "/v1/requests", json=body(), headers={"Idempotency-Key": "order-43"}
        )
        assert busy.status_code == 409 and busy.json()["code"] == "idempotency_key_in_use"
    later = await client.post("/v1/requests", json=body(), headers={"Idempotency-Key": "order-43"})
    assert later.status_code == 202
    assert await count_rows(app) == 2


async def test_cancel_and_list_with_cursor(client: httpx.AsyncClient) -> None:
    ids = [
        (await client.post("/v1/requests", json=body(input=f"r{i}"))).json()["id"] for i in range(5)
    ]
    cancelled = await client.post(f"/v1/requests/{ids[0]}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert (await client.post(f"/v1/requests/{ids[0]}/cancel")).status_code == 200  # idempotent
    assert (await client.post(f"/v1/requests/{uuid.uuid4()}/cancel")).status_code == 404
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["after"] = cursor
        page = (await client.get("/v1/requests", params=params)).json()
        seen += [r["id"] for r in page["data"]]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert seen == list(reversed(ids))
    only = (await client.get("/v1/requests", params={"status": "cancelled"})).json()
    assert [r["id"] for r in only["data"]] == [ids[0]]


async def test_long_poll_returns_when_a_notification_arrives(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    request_id = (await client.post("/v1/requests", json=body())).json()["id"]
    started = time.monotonic()
    poll = asyncio.create_task(client.get(f"/v1/requests/{request_id}", params={"wait": 20}))
    await asyncio.sleep(0.3)
    assert not poll.done()
    await store_of(app).cancel(uuid.UUID(request_id), "tests")  # publishes the change on Redis
    response = await poll
    assert response.json()["status"] == "cancelled"
    assert time.monotonic() - started < 5


async def wait_for_rows(app: FastAPI, count: int) -> list[str]:
    """The ids of the first ``count`` queued requests, once they are stored."""
    for _ in range(250):
        page = await store_of(app).list_requests("tests", limit=10)
        if len(page) >= count:
            return [str(r.id) for r in page]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{count} requests never stored")


@pytest.mark.parametrize("output", ["short", "x" * NOTIFIED_OUTPUT_MAX_CHARS])
async def test_a_waiting_caller_is_answered_from_the_results_notification(
    client: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch, output: str
) -> None:
    """A long-poll and a synchronous call, both waiting, get their results from the batch's
    notification (Redis) without reading Postgres again; a batch whose output is too large to
    carry makes each read its own."""
    submitted = (await client.post("/v1/requests", json=body())).json()["id"]
    poll = asyncio.create_task(client.get(f"/v1/requests/{submitted}", params={"wait": 20}))
    chat = {"model": "echo-100ms", "messages": [{"role": "user", "content": "hi"}]}
    call = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
    ids = await wait_for_rows(app, 2)
    await asyncio.sleep(0.3)  # both are waiting, past their reads
    assert not poll.done() and not call.done()
    store = store_of(app)
    reads = count_reads(store, monkeypatch)
    await complete(store, ids, output=output)
    polled, answered = await poll, await call
    assert polled.status_code == 200 and answered.status_code == 200, answered.text
    assert polled.json()["status"] == "succeeded" and polled.json()["output"]["text"] == output
    assert answered.json()["choices"][0]["message"]["content"] == output
    assert len(reads) == (0 if output == "short" else 2)
    assert NOTIFIED_OUTPUT_MAX_CHARS == 64 * 1024  # the README's "up to 64 Ki characters"


async def test_long_poll_times_out_with_the_current_state(client: httpx.AsyncClient) -> None:
    request_id = (await client.post("/v1/requests", json=body())).json()["id"]
    started = time.monotonic()
    response = await client.get(f"/v1/requests/{request_id}", params={"wait": 0.5})
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert 0.5 <= time.monotonic() - started < 3
    too_long = await client.get(f"/v1/requests/{request_id}", params={"wait": 3600})
    assert too_long.status_code == 422 and too_long.json()["field"] == "wait"


async def test_health_readiness_and_models(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    # What OpenAI-compatible benchmark clients (guidellm) probe, without a key.
    health = await client.get("/health", headers={"Authorization": ""})
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["status"] == "ready" and set(ready["checks"]) == {"database", "broker", "events"}
    models = (await client.get("/v1/models")).json()
    assert "echo-100ms" in [m["id"] for m in models["data"]]
    assert (await client.get("/v1/models/nope")).status_code == 404


async def test_nul_characters_are_refused_by_name_and_create_nothing(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    """Postgres text cannot hold NUL: a clear 4xx, never a 500 (found by schemathesis)."""
    for sent, field in [
        (body(input="a\x00b"), "input"),
        (body(input=None, messages=[{"role": "user", "content": "\x00"}]), "messages.0.content"),
        (body(metadata={"k": "v\x00"}), "metadata.k"),
    ]:
        response = await client.post("/v1/requests", json=sent)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == field
    listed = await client.get("/v1/requests", params={"model": "\x00x"})
    assert listed.status_code == 400 and listed.json()["field"] == "url"
    assert await count_rows(app) == 0


async def test_a_long_poll_for_a_request_admitted_here_reads_nothing_until_its_end(
    client: httpx.AsyncClient, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submit, then long-poll: the API process that admitted the request knows no end of it
    has been announced, so the wait starts without reading Postgres and is answered from the
    results' notification; the answer is what a read gives."""
    store = store_of(app)
    reads = count_reads(store, monkeypatch)
    submitted = (await client.post("/v1/requests", json=body())).json()["id"]
    poll = asyncio.create_task(client.get(f"/v1/requests/{submitted}", params={"wait": 20}))
    ids = await wait_for_rows(app, 1)
    await asyncio.sleep(0.3)
    assert not poll.done() and reads == []
    await complete(store, ids, output="done")
    polled = await poll
    assert polled.status_code == 200 and polled.json()["status"] == "succeeded"
    assert reads == []
    assert (await client.get(f"/v1/requests/{submitted}")).json() == polled.json()


async def test_a_long_poll_reads_first_where_an_end_could_have_gone_unheard(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    """A request that ended before its long-poll came answers at once (its end was heard);
    one this process no longer remembers (a reconnect forgets them all, as announcements may
    have been lost) is read first, and found ended; a wait for any change reads first too.
    Waiting for an announcement in either case would take the whole 20 s."""
    store = store_of(app)
    waiters = app.state.services.waiters
    first = (await client.post("/v1/requests", json=body())).json()["id"]
    await complete(store, [first], output="one")
    await asyncio.sleep(0.3)  # its end is heard here before the long-poll comes
    started = time.monotonic()
    answer = await client.get(f"/v1/requests/{first}", params={"wait": 20})
    assert answer.json()["status"] == "succeeded" and time.monotonic() - started < 5
    second = (await client.post("/v1/requests", json=body(input="two"))).json()["id"]
    changed = await client.get(f"/v1/requests/{second}", params={"wait": 0.2, "until": "change"})
    assert changed.json()["status"] == "queued"
    waiters.forget(second)  # as a reconnect forgets every admission
    await complete(store, [second], output="two")
    await asyncio.sleep(0.3)  # its announcement came and went: nothing waited for it
    started = time.monotonic()
    answer = await client.get(f"/v1/requests/{second}", params={"wait": 20})
    assert answer.json()["status"] == "succeeded" and time.monotonic() - started < 5
