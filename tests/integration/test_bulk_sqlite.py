"""A bulk job on the embedded backend (SQLite, in-process queue): the same driver and store."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from batchserve.core.broker import MemoryRequestQueue
from batchserve.core.bulk import Endpoint, FilePurpose, JobStatus, NewJob
from batchserve.core.db import create_engine
from batchserve.core.domain import ItemResult, Lane, Timings, from_epoch
from batchserve.core.errors import IdempotencyConflict
from batchserve.core.ids import uuid7
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.core.store import ItemOutcome, JobStore
from batchserve.core.store.creations import CreationKey
from batchserve.models.registry import load_registry
from batchserve.workers.jobs import JobDriver, JobDriverConfig
from tests.conftest import TEST_MODELS


async def test_a_job_ingests_runs_and_completes_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/bulk.sqlite3"
    upgrade(url)
    engine = create_engine(url)
    store = JobStore(engine)
    queue = MemoryRequestQueue()
    settings = Settings(home=tmp_path)
    driver = JobDriver(
        store=store,
        queue=queue,
        registry=load_registry(TEST_MODELS),
        settings=settings,
        config=JobDriverConfig(ingest_chunk=700),
    )
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "echo-100ms", "prompt": f"p{i}", "max_tokens": 4},
        }
        for i in range(1500)
    ]
    now = time.time()
    content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
    file = await store.create_file(
        tenant="t", purpose=FilePurpose.BATCH, filename="in.jsonl", content=content, now=now
    )
    job_id = uuid.uuid4()
    await store.create_job(
        NewJob(
            id=job_id,
            tenant="t",
            endpoint=Endpoint.COMPLETIONS,
            completion_window="24h",
            input_file_id=file.id,
            created_at=from_epoch(now),
            expires_at=from_epoch(now) + timedelta(hours=24),
        )
    )
    try:
        assert await driver.ingest_once(time.time()) == 1
        assert await queue.depth("echo-100ms", Lane.BULK) == 1500
        messages = await store.queued_messages()
        assert len(messages) == 1500 and {m.lane for m in messages} == {Lane.BULK}

        batch_id = uuid.uuid4()
        claimed = await store.claim_batch(
            batch_id=batch_id,
            model="echo-100ms",
            request_ids=[m.id for m in messages],
            now=time.time(),
            estimated_s=0.1,
            lease_until=time.time() + 30,
        )
        await store.start_batch(batch_id, "w", time.time(), 30)
        outcomes = [
            ItemOutcome(ItemResult(c.id, output=c.input, finish_reason="stop"), Timings(1, 1, 1, 3))
            for c in claimed
        ]
        await store.complete_batch(
            batch_id, attempt=1, outcomes=outcomes, now=time.time(), model_ms=100
        )
        await driver.settle(time.time())
        job = await store.get_job(job_id)
        assert job is not None and job.status is JobStatus.COMPLETED
        assert (job.counts.total, job.counts.completed, job.counts.failed) == (1500, 1500, 0)
        assert job.output_file_id is not None
        output = await store.file_content(job.output_file_id, "t")
        assert output is not None
        parsed = [orjson.loads(line) for line in output.splitlines()]
        assert [p["custom_id"] for p in parsed] == [f"c{i}" for i in range(1500)]
        assert parsed[7]["response"]["body"]["choices"][0]["text"] == "p7"
    finally:
        await engine.dispose()


async def test_files_list_and_delete_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/files.sqlite3"
    upgrade(url)
    store = JobStore(create_engine(url))
    now = time.time()
    made = [
        await store.create_file(
            tenant="t", purpose=FilePurpose.BATCH, filename=f"{n}.jsonl", content=b"{}\n", now=now
        )
        for n in range(3)
    ]
    ids = [f.id for f in made]
    assert [f.id for f in await store.list_files("t", limit=10)] == ids[::-1]
    assert [f.id for f in await store.list_files("t", limit=10, newest_first=False)] == ids
    assert [f.id for f in await store.list_files("t", limit=10, after=ids[2])] == ids[1::-1]
    assert await store.list_files("t", limit=10, purpose=FilePurpose.BATCH_OUTPUT) == []
    assert await store.list_files("u", limit=10) == []
    assert not await store.delete_file(ids[0], "u")  # another tenant's: nothing deleted
    assert await store.delete_file(ids[0], "t")
    assert await store.file_content(ids[0], "t") is None
    assert not await store.delete_file(ids[0], "t")
    assert [f.id for f in await store.list_files("t", limit=10)] == ids[:0:-1]


async def test_an_idempotency_key_creates_one_file_and_one_job_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/keys.sqlite3"
    upgrade(url)
    store = JobStore(create_engine(url))
    now = time.time()

    async def upload(fingerprint: str) -> uuid.UUID:
        made = await store.create_file(
            tenant="t",
            purpose=FilePurpose.BATCH,
            filename="in.jsonl",
            content=b"{}\n",
            now=now,
            idempotency=CreationKey("k", fingerprint),
        )
        return made.id

    async def create(file_id: uuid.UUID) -> uuid.UUID:
        job = NewJob(
            id=uuid7(),
            tenant="t",
            endpoint=Endpoint.CHAT,
            completion_window="24h",
            input_file_id=file_id,
            created_at=from_epoch(now),
            expires_at=from_epoch(now + 86_400),
        )
        made = await store.create_job(job, idempotency=CreationKey("k", "a" * 64))
        return made.id

    file_id = await upload("a" * 64)
    assert await upload("a" * 64) == file_id
    with pytest.raises(IdempotencyConflict):
        await upload("b" * 64)
    assert await create(file_id) == await create(file_id)
    assert len(await store.list_jobs("t", limit=10)) == 1
