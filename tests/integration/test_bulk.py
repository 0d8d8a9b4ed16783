"""Bulk jobs and the OpenAI surface on the real app, Postgres, RabbitMQ and Redis, with the job
driver stepped by the test (its clock is a parameter) and batches completed through the store
the way a worker completes them."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from fastapi import FastAPI

from batchserve.api.batch_input import ValidatedFile, validate_file
from batchserve.core.broker import Handler, RequestQueue
from batchserve.core.bulk import JOB_PREFIX, FilePurpose, parse_public_id
from batchserve.core.domain import ItemResult, Lane, QueueMessage, Timings, from_epoch
from batchserve.core.errors import Unavailable
from batchserve.core.ids import job_request_id
from batchserve.core.settings import Settings
from batchserve.core.store import ItemOutcome, JobStore
from batchserve.workers.jobs import JobDriver, JobDriverConfig
from batchserve.workers.maintenance import Maintenance, MaintenanceConfig
from tests.support import keys
from tests.support.inprocess import asgi_client, running_app

CHAT = "/v1/chat/completions"


def settings_with(settings: Settings, **overrides: Any) -> Settings:
    return settings.model_copy(update=overrides)


@pytest.fixture
async def bulk_settings(settings: Settings) -> Settings:
    return settings_with(
        settings, batch_min_window_s=1.0, webhook_allowlist="127.0.0.1", batch_max_requests=50
    )


@pytest.fixture
async def app(bulk_settings: Settings) -> AsyncIterator[FastAPI]:
    async with running_app(bulk_settings) as application:
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as http:
        yield http


class RecordingQueue(RequestQueue):
    """The app's real request queue, with a record of what was confirmed on it; ``refuse``
    publishes make it answer as a broker that is down would."""

    def __init__(self, inner: RequestQueue, refuse: int = 0) -> None:
        self.inner = inner
        self.refuse = refuse
        self.published: list[str] = []

    async def publish(self, messages: Sequence[QueueMessage]) -> None:
        if self.refuse > 0:
            self.refuse -= 1
            raise Unavailable("broker publish failed: refused by the test", component="broker")
        await self.inner.publish(messages)
        self.published.extend(m.id for m in messages)

    async def consume(self, model: str, lane: Lane, handler: Handler, prefetch: int) -> None:
        await self.inner.consume(model, lane, handler, prefetch)


def driver_of(
    app: FastAPI, chunk: int = 5000, queue: RequestQueue | None = None, tick_s: float = 0.5
) -> JobDriver:
    adapters = app.state.services.adapters
    return JobDriver(
        store=adapters.store,
        queue=queue or adapters.queue,
        registry=adapters.registry,
        settings=adapters.settings,
        config=JobDriverConfig(ingest_chunk=chunk, tick_s=tick_s),
        events=adapters.events,
    )


def job_uuid(batch_id: str) -> uuid.UUID:
    parsed = parse_public_id(batch_id, JOB_PREFIX)
    assert parsed is not None
    return parsed


def store_of(app: FastAPI) -> JobStore:
    return app.state.services.adapters.store


def chat_line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "echo-100ms", "messages": [{"role": "user", "content": text}], **body},
    }


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((ln if isinstance(ln, bytes) else orjson.dumps(ln)) + b"\n" for ln in lines)


async def upload(client: httpx.AsyncClient, content: bytes) -> str:
    response = await client.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


async def create_batch(
    client: httpx.AsyncClient, content: bytes, window: str = "24h", **extra: Any
) -> dict[str, Any]:
    body = {"input_file_id": await upload(client, content), "endpoint": CHAT}
    response = await client.post("/v1/batches", json=body | {"completion_window": window} | extra)
    assert response.status_code == 200, response.text
    created = response.json()
    assert created["status"] == "validating" and created["object"] == "batch"
    return created


async def get_batch(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/batches/{batch_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def content_lines(client: httpx.AsyncClient, file_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return [orjson.loads(line) for line in response.content.splitlines()]


async def run_all(store: JobStore, job_id: str, model: str = "echo-100ms") -> None:
    """What batcher and worker do: claim the job's queued requests, answer each with its input."""
    job = job_uuid(job_id)
    async with store.engine.connect() as conn:
        rows = (
            await conn.exec_driver_sql(
                "SELECT id FROM requests WHERE job_id = %(j)s AND state = 'queued'", {"j": job}
            )
        ).all()
    ids = [str(r[0]) for r in rows]
    now = time.time()
    batch_id = uuid.uuid4()
    claimed = await store.claim_batch(
        batch_id=batch_id,
        model=model,
        request_ids=ids,
        now=now,
        estimated_s=0.1,
        lease_until=now + 30,
    )
    start = await store.start_batch(batch_id, "test-worker", now, 30)
    assert start is not None
    outcomes = [
        ItemOutcome(
            ItemResult(
                c.id,
                output=(c.messages or [{}])[-1]["content"],
                finish_reason="stop",
                prompt_tokens=1,
                completion_tokens=1,
            ),
            Timings(1.0, 1.0, 100.0, 102.0),
        )
        for c in claimed
    ]
    await store.complete_batch(
        batch_id, attempt=1, outcomes=outcomes, now=time.time(), model_ms=100.0
    )


async def test_a_job_goes_from_validating_to_completed_with_one_line_per_custom_id(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    lines = [chat_line(f"req-{i}", f"hello {i}") for i in range(12)]
    created = await create_batch(
        client, jsonl(lines), metadata={"team": "x"}, webhook_url="http://127.0.0.1:9/hook"
    )
    driver = driver_of(app, chunk=5)
    assert await driver.ingest_once(time.time()) == 1
    started = await get_batch(client, created["id"])
    assert started["status"] == "in_progress" and started["in_progress_at"] is not None
    assert started["request_counts"] == {"total": 12, "completed": 0, "failed": 0}
    assert started["model"] == "echo-100ms" and started["metadata"] == {"team": "x"}

    await run_all(store_of(app), created["id"])
    await driver.settle(time.time())
    done = await get_batch(client, created["id"])
    assert done["status"] == "completed", done
    assert done["finalizing_at"] and done["completed_at"] and done["error_file_id"] is None
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    output = await content_lines(client, done["output_file_id"])
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(12)]
    first = output[0]
    assert first["error"] is None and first["response"]["status_code"] == 200
    body = first["response"]["body"]
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "hello 0",
        "refusal": None,
    }
    file_info = (await client.get(f"/v1/files/{done['output_file_id']}")).json()
    assert file_info["purpose"] == "batch_output" and file_info["object"] == "file"

    # The batch.completed webhook was queued with the transition that ended the job.
    async with store_of(app).engine.connect() as conn:
        events = (
            await conn.exec_driver_sql(
                "SELECT event_type, request_id FROM webhook_deliveries WHERE job_id = %(j)s",
                {"j": job_uuid(created["id"])},
            )
        ).all()
    assert [tuple(e) for e in events] == [("batch.completed", None)]


async def test_the_driver_takes_a_new_job_and_a_cancellation_at_once_not_at_its_tick(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    async with running_beside(driver_of(app, tick_s=60.0).run()):
        await asyncio.sleep(0.5)  # both loops found nothing and wait out a minute's tick
        created = await create_batch(client, jsonl([chat_line("a", "x"), chat_line("b", "y")]))
        await until(lambda: status_of(client, created["id"]), "in_progress")
        assert (await client.post(f"/v1/batches/{created['id']}/cancel")).status_code == 200
        await until(lambda: status_of(client, created["id"]), "cancelled")


@contextlib.asynccontextmanager
async def running_beside(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_maintenance_wakes_a_driver_that_polls_nothing_when_a_job_has_work(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    """Under maintenance the driver has no tick of its own: each maintenance tick's probe
    (``JobStore.due``) wakes the loop that has work, announced or not."""
    adapters = app.state.services.adapters
    driver = JobDriver(  # no events: it hears of no job but through maintenance
        store=adapters.store,
        queue=adapters.queue,
        registry=adapters.registry,
        settings=adapters.settings,
    )
    maintenance = Maintenance(
        store=adapters.store,
        queue=adapters.queue,
        events=adapters.events,
        config=MaintenanceConfig(tick_s=0.1),
        jobs=driver,
    )
    store = store_of(app)
    assert not await store.due(time.time(), unpublished_before=time.time() - 60)
    created = await create_batch(client, jsonl([chat_line("a", "x"), chat_line("b", "y")]))
    due = await store.due(time.time(), unpublished_before=time.time() - 60)
    assert due.ingest and due.jobs
    async with running_beside(maintenance.run()):
        await until(lambda: status_of(client, created["id"]), "in_progress")
        due = await store.due(time.time(), unpublished_before=time.time() - 60)
        assert not due.ingest and due.jobs
        assert (await client.post(f"/v1/batches/{created['id']}/cancel")).status_code == 200
        await until(lambda: status_of(client, created["id"]), "cancelled")
    assert not await store.due(time.time(), unpublished_before=time.time() - 60)


async def status_of(client: httpx.AsyncClient, batch_id: str) -> str:
    return str((await get_batch(client, batch_id))["status"])


async def until(read: Any, value: str, timeout_s: float = 10.0) -> None:
    give_up = time.monotonic() + timeout_s
    while (seen := await read()) != value:
        assert time.monotonic() < give_up, f"still {seen!r}, not {value!r}"
        await asyncio.sleep(0.05)


async def test_a_bad_file_fails_the_job_with_each_error_on_its_line(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    other = dict(chat_line("c", "x"), url="/v1/completions")
    lines: list[Any] = [
        chat_line("a", "fine"),
        b"{not json",
        chat_line("a", "again"),
        other,
        dict(chat_line("d", "x"), method="GET"),
        chat_line("e", "x")
        | {"body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}},
        chat_line("f", "x", temperature=5),
        chat_line("g", "x", n=2),
        chat_line("h", "x", max_tokens=10**6),
        chat_line("i", "x", stream=True),  # a job's answers go to its output file
    ]
    created = await create_batch(client, jsonl(lines))
    await driver_of(app).ingest_once(time.time())
    failed = await get_batch(client, created["id"])
    assert failed["status"] == "failed" and failed["failed_at"] is not None
    errors = {e["line"]: e for e in failed["errors"]["data"]}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert errors[2]["code"] == "invalid_json_line"
    assert errors[3]["code"] == "duplicate_custom_id"
    assert errors[4]["code"] == "invalid_url"
    assert errors[5]["code"] == "invalid_method"
    assert errors[6]["code"] == "model_not_found"
    assert errors[7]["param"] == "body.temperature"
    assert errors[8]["param"] == "body.n"
    assert errors[9]["param"] == "body.max_tokens"
    assert errors[10]["param"] == "body.stream"
    assert failed["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert await store_of(app).job_counts(job_uuid(created["id"])) == {}


async def test_a_bad_line_after_chunks_were_written_refuses_the_file_and_removes_them(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    lines: list[Any] = [chat_line(f"r{i}", f"t{i}") for i in range(11)]
    lines[9] = b"{not json"
    created = await create_batch(client, jsonl(lines))
    queue = RecordingQueue(app.state.services.adapters.queue)
    # Chunks of 4: lines 1-8 are checked (and written) before line 10 is read.
    assert await driver_of(app, chunk=4, queue=queue).ingest_once(time.time()) == 1
    failed = await get_batch(client, created["id"])
    assert failed["status"] == "failed"
    assert [(e["line"], e["code"]) for e in failed["errors"]["data"]] == [(10, "invalid_json_line")]
    assert await store_of(app).job_counts(job_uuid(created["id"])) == {}
    assert queue.published == []


async def test_over_the_line_count_limit_is_refused_at_the_first_line_too_many(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", "x") for i in range(51)]))
    await driver_of(app).ingest_once(time.time())
    failed = await get_batch(client, created["id"])
    assert failed["status"] == "failed"
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [("too_many_requests", 51)]


async def test_a_job_past_its_window_expires_with_batch_expired_lines(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", "x") for i in range(6)]), "2s")
    driver = driver_of(app)
    await driver.ingest_once(time.time())
    await driver.settle(time.time() + 5)
    expired = await get_batch(client, created["id"])
    assert expired["status"] == "expired" and expired["expired_at"] is not None
    assert expired["request_counts"] == {"total": 6, "completed": 0, "failed": 6}
    assert expired["output_file_id"] is None
    errors = await content_lines(client, expired["error_file_id"])
    assert sorted(e["custom_id"] for e in errors) == [f"r{i}" for i in range(6)]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_ingest_that_died_halfway_resumes_without_duplicates(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", f"t{i}") for i in range(10)]))
    store = store_of(app)
    queue = RecordingQueue(app.state.services.adapters.queue)
    first = driver_of(app, chunk=4, queue=queue)
    claim = await store.claim_ingest(time.time(), lease_s=30)
    assert claim is not None
    content = await store.file_content(claim.input_file_id, claim.tenant)
    checked = validate_file(
        content or b"",
        claim=claim,
        registry=first._registry,
        settings=first._settings,
        now=from_epoch(time.time()),
    )
    assert isinstance(checked, ValidatedFile)
    assert await store.ingest_chunk(
        claim, checked.commands[:4], start=0, now=time.time(), lease_s=30
    )
    # The first driver dies here, its chunk committed but not published. Nobody else may take
    # the job until its lease runs out...
    assert await store.claim_ingest(time.time(), lease_s=30) is None
    # ... and once it has, the next driver publishes that chunk and resumes at line 5.
    second = await store.claim_ingest(time.time() + 31, lease_s=30)
    assert second is not None and (second.ingested_lines, second.published_lines) == (4, 0)
    await first.ingest(second)
    # The dead driver's claim is fenced off: it cannot write again.
    assert not await store.ingest_chunk(
        claim, checked.commands[4:], start=4, now=time.time(), lease_s=30
    )
    started = await get_batch(client, created["id"])
    assert started["status"] == "in_progress"
    assert started["request_counts"]["total"] == 10
    job = job_uuid(created["id"])
    assert await store.job_counts(job) == {"queued": 10}
    assert queue.published == [str(job_request_id(job, i)) for i in range(10)]


async def test_a_chunk_the_broker_did_not_confirm_is_published_by_the_next_driver(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", f"t{i}") for i in range(6)]))
    store = store_of(app)
    queue = RecordingQueue(app.state.services.adapters.queue, refuse=1)
    driver = driver_of(app, chunk=4, queue=queue)
    now = time.time()
    assert await driver.ingest_once(now) == 1
    # Every chunk is committed, the publish refused: the job is not started.
    job = job_uuid(created["id"])
    assert (await get_batch(client, created["id"]))["status"] == "validating"
    assert await store.job_counts(job) == {"queued": 6}
    assert queue.published == []
    # Its lease runs out; the next attempt publishes what is committed and starts the job.
    assert await driver.ingest_once(now + 31) == 1
    assert (await get_batch(client, created["id"]))["status"] == "in_progress"
    assert queue.published == [str(job_request_id(job, i)) for i in range(6)]


async def test_cancelling_a_job_cancels_its_requests_and_ends_cancelled(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", "x") for i in range(8)]))
    driver = driver_of(app)
    await driver.ingest_once(time.time())
    cancelling = (await client.post(f"/v1/batches/{created['id']}/cancel")).json()
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    await driver.settle(time.time())
    cancelled = await get_batch(client, created["id"])
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
    assert cancelled["request_counts"] == {"total": 8, "completed": 0, "failed": 8}
    errors = await content_lines(client, cancelled["error_file_id"])
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"} and len(errors) == 8
    again = await client.post(f"/v1/batches/{created['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    async with store_of(app).engine.connect() as conn:
        logged = (
            await conn.exec_driver_sql(
                "SELECT count(*) FROM request_events e JOIN requests r ON r.id = e.request_id"
                " WHERE r.job_id = %(j)s AND e.state = 'cancelled'",
                {"j": job_uuid(created["id"])},
            )
        ).scalar()
    assert logged == 8


async def test_list_batches_pages_newest_first_in_the_openai_list_shape(
    client: httpx.AsyncClient,
) -> None:
    ids = [(await create_batch(client, jsonl([chat_line("a", "x")])))["id"] for _ in range(3)]
    page = (await client.get("/v1/batches", params={"limit": 2})).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [b["id"] for b in page["data"]] == ids[::-1][:2]
    assert page["first_id"] == ids[2] and page["last_id"] == ids[1]
    rest = (await client.get("/v1/batches", params={"limit": 2, "after": page["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False
    other = await client.get("/v1/batches", headers=keys.auth("someone-else"))
    assert other.json()["data"] == []
    assert (
        await client.get(f"/v1/batches/{ids[0]}", headers=keys.auth("someone-else"))
    ).status_code == 404


async def test_list_files_pages_in_either_order_in_the_openai_list_shape(
    client: httpx.AsyncClient,
) -> None:
    ids = [await upload(client, jsonl([chat_line(f"{n}", "x")])) for n in range(3)]
    page = (await client.get("/v1/files", params={"limit": 2})).json()
    assert page["object"] == "list" and page["has_more"] is True
    assert [f["id"] for f in page["data"]] == ids[::-1][:2]
    assert page["first_id"] == ids[2] and page["last_id"] == ids[1]
    assert all(f["object"] == "file" and f["purpose"] == "batch" for f in page["data"])
    rest = (await client.get("/v1/files", params={"limit": 2, "after": page["last_id"]})).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    oldest = (await client.get("/v1/files", params={"order": "asc"})).json()
    assert [f["id"] for f in oldest["data"]] == ids and oldest["has_more"] is False
    later = (await client.get("/v1/files", params={"order": "asc", "after": ids[0]})).json()
    assert [f["id"] for f in later["data"]] == ids[1:]
    outputs = (await client.get("/v1/files", params={"purpose": "batch_output"})).json()
    assert outputs["data"] == [] and outputs["first_id"] is None
    assert (await client.get("/v1/files", headers=keys.auth("someone-else"))).json()["data"] == []
    for params, param in (
        ({"after": "batch_x"}, "after"),
        ({"purpose": "fine-tune"}, "purpose"),
        ({"order": "newest"}, "order"),
        ({"limit": 10_001}, "limit"),
    ):
        refused = await client.get("/v1/files", params=params)
        assert refused.status_code == 400, (params, refused.text)
        assert refused.json()["error"]["param"] == param


async def test_deleting_a_file_removes_it_unless_a_batch_still_reads_it(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await create_batch(client, jsonl([chat_line(f"r{i}", "x") for i in range(4)]))
    input_id = created["input_file_id"]
    in_use = await client.delete(f"/v1/files/{input_id}")
    assert in_use.status_code == 409, in_use.text
    assert created["id"] in in_use.json()["error"]["message"]
    assert (await client.get(f"/v1/files/{input_id}")).status_code == 200  # nothing changed
    assert (
        await client.delete(f"/v1/files/{input_id}", headers=keys.auth("someone-else"))
    ).status_code == 404

    # Once the batch has ended, its input and its error file go like any other.
    driver = driver_of(app)
    await driver.ingest_once(time.time())
    await client.post(f"/v1/batches/{created['id']}/cancel")
    await driver.settle(time.time())
    ended = await get_batch(client, created["id"])
    assert ended["status"] == "cancelled"
    for file_id in (input_id, ended["error_file_id"]):
        deleted = await client.delete(f"/v1/files/{file_id}")
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
        assert (await client.get(f"/v1/files/{file_id}")).status_code == 404
        assert (await client.get(f"/v1/files/{file_id}/content")).status_code == 404
        assert (await client.delete(f"/v1/files/{file_id}")).status_code == 404
    assert (await client.get("/v1/files")).json()["data"] == []
    assert (await get_batch(client, created["id"]))["status"] == "cancelled"


async def test_a_file_with_expires_after_is_gone_once_it_passes_and_maintenance_deletes_it(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    def expiring(seconds: object, anchor: object = "created_at") -> dict[str, object]:
        return {
            "purpose": "batch",
            "expires_after[anchor]": anchor,
            "expires_after[seconds]": seconds,
        }

    async def upload_with(form: dict[str, object]) -> httpx.Response:
        content = jsonl([chat_line("a", "x")])
        return await client.post("/v1/files", files={"file": ("in.jsonl", content)}, data=form)

    made = (await upload_with(expiring(3600))).json()
    assert made["expires_at"] == made["created_at"] + 3600
    assert (await client.get(f"/v1/files/{made['id']}")).json()["expires_at"] == made["expires_at"]
    alone = (await upload_with({"purpose": "batch", "expires_after[seconds]": 7200})).json()
    assert alone["expires_at"] == alone["created_at"] + 7200  # anchored at created_at
    await client.delete(f"/v1/files/{alone['id']}")
    forever = await upload(client, jsonl([chat_line("b", "x")]))
    kept = (await client.get(f"/v1/files/{forever}")).json()
    assert kept["expires_at"] == kept["created_at"] + 30 * 86_400  # the file retention
    forms: list[tuple[dict[str, object], str]] = [
        (expiring(10), "expires_after[seconds]"),  # OpenAI's bounds: an hour to 30 days
        (expiring(2_592_001), "expires_after[seconds]"),
        (expiring(3600, anchor="last_active_at"), "expires_after[anchor]"),
        ({"purpose": "batch", "expires_after[anchor]": "created_at"}, "expires_after[seconds]"),
    ]
    for form, param in forms:
        refused = await upload_with(form)
        assert refused.status_code == 400, (form, refused.text)
        assert refused.json()["error"]["param"] == param, refused.text

    # One expiring file is a running batch's input; both pass their time.
    used = (await upload_with(expiring(3600))).json()
    job = await client.post(
        "/v1/batches",
        json={"input_file_id": used["id"], "endpoint": CHAT, "completion_window": "24h"},
    )
    assert job.status_code == 200, job.text
    passed = [str(uuid.UUID(f["id"].removeprefix("file-"))) for f in (made, used)]
    async with store_of(app).engine.begin() as conn:
        await conn.exec_driver_sql(
            "UPDATE files SET expires_at = now() - interval '1 second' "
            f"WHERE id IN ('{passed[0]}', '{passed[1]}')"
        )
    for file_id in (made["id"], used["id"]):
        assert (await client.get(f"/v1/files/{file_id}")).status_code == 404
        assert (await client.get(f"/v1/files/{file_id}/content")).status_code == 404
    assert [f["id"] for f in (await client.get("/v1/files")).json()["data"]] == [forever]
    reuse = await client.post(
        "/v1/batches",
        json={"input_file_id": made["id"], "endpoint": CHAT, "completion_window": "24h"},
    )
    assert reuse.status_code == 404, reuse.text

    adapters = app.state.services.adapters
    maintenance = Maintenance(store=adapters.store, queue=adapters.queue, events=adapters.events)
    report = await maintenance.tick(time.time())
    assert report.files_deleted == 1  # the running batch still reads the other
    async with store_of(app).engine.connect() as conn:
        left = (await conn.exec_driver_sql("SELECT count(*) FROM files")).scalar()
    assert left == 2
    # The batch reads its input although the API no longer shows it.
    driver = driver_of(app)
    assert await driver.ingest_once(time.time()) == 1
    assert (await get_batch(client, job.json()["id"]))["status"] == "in_progress"


async def test_output_expires_after_sets_the_expiry_of_the_files_a_batch_writes(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    expiry = {"anchor": "created_at", "seconds": 7200}
    created = await create_batch(
        client, jsonl([chat_line(f"r{i}", "x") for i in range(3)]), output_expires_after=expiry
    )
    driver = driver_of(app)
    await driver.ingest_once(time.time())
    await client.post(f"/v1/batches/{created['id']}/cancel")
    await driver.settle(time.time())
    ended = await get_batch(client, created["id"])
    written = (await client.get(f"/v1/files/{ended['error_file_id']}")).json()
    assert written["purpose"] == "batch_output"
    assert written["expires_at"] == written["created_at"] + 7200
    read = (await client.get(f"/v1/files/{created['input_file_id']}")).json()
    assert read["expires_at"] == read["created_at"] + 30 * 86_400  # the file retention

    input_id = await upload(client, jsonl([chat_line("a", "x")]))
    for value, param in (
        ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds"),
        ({"anchor": "last_active_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 3600, "after": 1}, "output_expires_after.after"),
    ):
        refused = await client.post(
            "/v1/batches",
            json={
                "input_file_id": input_id,
                "endpoint": CHAT,
                "completion_window": "24h",
                "output_expires_after": value,
            },
        )
        assert refused.status_code == 400, (value, refused.text)
        assert refused.json()["error"]["param"] == param, refused.text


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"n": 2}, 400, "n", "invalid_input"),
        ({"stream_options": {"include_usage": True}}, 400, "stream_options", "invalid_input"),
        ({"temperature": 5}, 400, "temperature", "invalid_input"),
        ({"max_tokens": 10**6}, 400, "max_tokens", "invalid_input"),
        ({"model": "no-such-model"}, 404, "model", "model_not_found"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            400,
            "messages[0].role",
            "invalid_input",
        ),
        ({"temperature": "hot"}, 400, "temperature", "invalid_value"),
    ],
)
async def test_openai_routes_answer_errors_in_openai_shape(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, param: str, code: str
) -> None:
    base = {"model": "echo-100ms", "messages": [{"role": "user", "content": "hi"}]}
    response = await client.post(CHAT, json=base | body)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == code and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")


async def test_batch_creation_refuses_bad_endpoint_window_and_file(
    client: httpx.AsyncClient,
) -> None:
    file_id = await upload(client, jsonl([chat_line("a", "x")]))
    base = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    bad_endpoint = await client.post("/v1/batches", json=base | {"endpoint": "/v1/responses"})
    assert bad_endpoint.status_code == 400 and bad_endpoint.json()["error"]["param"] == "endpoint"
    bad_window = await client.post("/v1/batches", json=base | {"completion_window": "30d"})
    assert bad_window.json()["error"]["param"] == "completion_window"
    missing = await client.post("/v1/batches", json=base | {"input_file_id": "file-nope"})
    assert missing.status_code == 404 and "error" in missing.json()
    wrong_purpose = await client.post(
        "/v1/files", files={"file": ("x.jsonl", b"{}")}, data={"purpose": "fine-tune"}
    )
    assert wrong_purpose.status_code == 400
    assert wrong_purpose.json()["error"]["param"] == "purpose"


async def test_a_retried_upload_or_batch_with_its_idempotency_key_creates_one_object(
    client: httpx.AsyncClient, bulk_settings: Settings
) -> None:
    content = jsonl([chat_line("a", "x")])
    key = {"Idempotency-Key": "upload-1"}

    async def upload_with(headers: dict[str, str], body: bytes) -> httpx.Response:
        files = {"file": ("in.jsonl", body)}
        return await client.post(
            "/v1/files", files=files, data={"purpose": "batch"}, headers=headers
        )

    first, again = await upload_with(key, content), await upload_with(key, content)
    assert first.status_code == again.status_code == 200, again.text
    assert first.json() == again.json()
    other = await upload_with(key, jsonl([chat_line("b", "y")]))
    assert other.status_code == 400 and "different request body" in other.text
    file_id = first.json()["id"]
    create = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
    batch_key = {"Idempotency-Key": "batch-1"}
    job = await client.post("/v1/batches", json=create, headers=batch_key)
    replay = await client.post("/v1/batches", json=create, headers=batch_key)
    assert job.status_code == replay.status_code == 200, replay.text
    assert replay.json()["id"] == job.json()["id"]
    changed = await client.post(
        "/v1/batches", json={**create, "metadata": {"run": "2"}}, headers=batch_key
    )
    assert changed.status_code == 400 and "different request body" in changed.text
    # Without a key every call creates.
    assert (await client.post("/v1/batches", json=create)).json()["id"] != job.json()["id"]
    assert bulk_settings.database_url
    with psycopg.connect(bulk_settings.database_url.replace("+psycopg", "")) as conn:
        files = conn.execute("SELECT count(*) FROM files WHERE purpose = 'batch'").fetchone()
        jobs = conn.execute("SELECT count(*) FROM batch_jobs").fetchone()
    assert files == (1,) and jobs == (2,)


async def test_keys_of_created_objects_are_forgotten_with_the_requests_keys(
    bulk_settings: Settings,
) -> None:
    from batchserve.core.store.creations import CreationKey
    from batchserve.core.wiring import connect

    adapters = connect(bulk_settings, pool_size=2)
    now = time.time()

    async def create() -> uuid.UUID:
        made = await adapters.store.create_file(
            tenant="t",
            purpose=FilePurpose.BATCH,
            filename="a",
            content=b"{}\n",
            now=now,
            idempotency=CreationKey("k", "f" * 64),
        )
        return made.id

    try:
        first = await create()
        assert await create() == first
        assert await adapters.store.prune_idempotency(now - 1) == 0  # not old enough
        assert await adapters.store.prune_idempotency(now + 1) == 1
        assert await create() != first  # a new call once the key is forgotten
    finally:
        await adapters.close()


async def test_with_no_file_retention_files_and_outputs_are_kept_until_deleted(
    settings: Settings,
) -> None:
    kept_settings = settings_with(settings, file_retention_s=0, batch_min_window_s=1.0)
    async with running_app(kept_settings) as application, asgi_client(application) as client:
        file_id = await upload(client, jsonl([chat_line("a", "x")]))
        assert (await client.get(f"/v1/files/{file_id}")).json()["expires_at"] is None
        create = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}
        job = (await client.post("/v1/batches", json=create)).json()
    assert kept_settings.database_url
    with psycopg.connect(kept_settings.database_url.replace("+psycopg", "")) as conn:
        row = conn.execute(
            "SELECT output_expires_after_s FROM batch_jobs WHERE id = %s",
            (uuid.UUID(job["id"].removeprefix(JOB_PREFIX)),),
        ).fetchone()
    assert row == (None,)
