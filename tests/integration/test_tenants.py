"""Tenants: keys, isolation of every resource, quotas and the backlog bound, on the real app
with Postgres, RabbitMQ and Redis behind it."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from batchserve.cli.keys import first_key, make_key
from batchserve.cli.main import app as cli_app
from batchserve.core import apikeys
from batchserve.core.db import create_engine
from batchserve.core.loadboard import LoadSnapshot
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.core.store import JobStore
from batchserve.workers.jobs import JobDriver, JobDriverConfig
from tests.support import keys
from tests.support.inprocess import asgi_client, running_app, tenant_settings

ECHO = "echo-100ms"
CHAT = "/v1/chat/completions"


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    async with running_app(tenant_settings(settings)) as application:
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app, authed=False) as http:
        yield http


def store_of(app: FastAPI) -> JobStore:
    return app.state.services.adapters.store


async def new_tenant(app: FastAPI, name: str, **quotas: Any) -> dict[str, str]:
    made, _ = await make_key(store_of(app), name, None, **quotas)
    return {"Authorization": f"Bearer {made.key}"}


async def count_requests(app: FastAPI, tenant: str) -> int:
    async with store_of(app).engine.connect() as conn:
        result = await conn.exec_driver_sql(
            "SELECT count(*) FROM requests WHERE tenant = %(t)s", {"t": tenant}
        )
        return int(result.scalar_one())


def jsonl(count: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"c{i}",
                "method": "POST",
                "url": CHAT,
                "body": {"model": ECHO, "messages": [{"role": "user", "content": f"m{i}"}]},
            }
        )
        + b"\n"
        for i in range(count)
    )


async def test_a_key_is_stored_as_a_hash_and_stops_working_when_revoked(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    made, tenant = await make_key(store_of(app), "carol", "laptop", weight=2.0)
    assert tenant.weight == 2.0
    headers = {"Authorization": f"Bearer {made.key}"}
    assert (await client.get("/v1/requests", headers=headers)).status_code == 200
    async with store_of(app).engine.connect() as conn:
        rows = (await conn.exec_driver_sql("SELECT * FROM api_keys")).all()
    assert made.key not in repr(rows)
    assert any(hashlib.sha256(made.key.encode()).hexdigest() in repr(r) for r in rows)
    # A well-formed key with the right id but the wrong secret is refused.
    forged = made.key[:-4] + ("AAAA" if not made.key.endswith("AAAA") else "BBBB")
    assert (
        await client.get("/v1/requests", headers={"Authorization": f"Bearer {forged}"})
    ).status_code == 401
    assert await store_of(app).revoke_key(made.id, now=time.time())
    refused = await client.get("/v1/requests", headers=headers)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]


async def test_over_the_rate_a_tenant_gets_429_with_retry_after(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    # A token every 10 s: five posts never take that long, however busy the machine (at 2/s a
    # loaded CI machine took over 0.5 s for the first four, and the fourth got a new token).
    headers = await new_tenant(app, "ratey", rate_per_s=0.1, burst=3)
    answers = [
        await client.post("/v1/requests", json={"model": ECHO, "input": f"{i}"}, headers=headers)
        for i in range(5)
    ]
    assert [a.status_code for a in answers] == [202, 202, 202, 429, 429]
    refused = answers[3]
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["code"] == "quota_exceeded"
    assert refused.json()["limit_name"] == "rate_per_s" and refused.json()["limit"] == 0.1
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert await count_requests(app, "ratey") == 3  # refusals persist nothing
    # Another tenant is not slowed by ratey's bucket.
    other = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "x"}, headers=keys.auth()
    )
    assert other.status_code == 202


async def test_over_the_queued_quota_a_tenant_gets_429(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    headers = await new_tenant(app, "queuey", max_queued=3)
    codes = [
        (
            await client.post(
                "/v1/requests", json={"model": ECHO, "input": f"{i}"}, headers=headers
            )
        ).status_code
        for i in range(4)
    ]
    assert codes == [202, 202, 202, 429]
    refused = await client.post("/v1/requests", json={"model": ECHO, "input": "x"}, headers=headers)
    assert refused.json()["limit_name"] == "max_queued" and refused.json()["limit"] == 3
    assert refused.headers["retry-after"]
    assert await count_requests(app, "queuey") == 3
    # A retry of an accepted request still gets its original answer, over quota or not.
    replay_key = {"Idempotency-Key": "k1"}
    tenant_b = await new_tenant(app, "queuey2", max_queued=1)
    first = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "r"}, headers=tenant_b | replay_key
    )
    again = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "r"}, headers=tenant_b | replay_key
    )
    assert first.status_code == again.status_code == 202
    assert again.headers["idempotent-replayed"] == "true"


async def test_a_bulk_job_over_the_tenants_bulk_quota_fails_validation(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    headers = await new_tenant(app, "bulky", max_bulk_in_flight=5)
    uploaded = await client.post(
        "/v1/files",
        files={"file": ("in.jsonl", jsonl(6))},
        data={"purpose": "batch"},
        headers=headers,
    )
    job = await client.post(
        "/v1/batches",
        json={"input_file_id": uploaded.json()["id"], "endpoint": CHAT, "completion_window": "24h"},
        headers=headers,
    )
    assert job.status_code == 200
    adapters = app.state.services.adapters
    driver = JobDriver(
        store=adapters.store,
        queue=adapters.queue,
        registry=adapters.registry,
        settings=adapters.settings,
        config=JobDriverConfig(),
    )
    assert await driver.ingest_once(time.time()) == 1
    failed = (await client.get(f"/v1/batches/{job.json()['id']}", headers=headers)).json()
    assert failed["status"] == "failed"
    assert failed["errors"]["data"][0]["code"] == "quota_exceeded"
    assert "max_bulk_in_flight" in failed["errors"]["data"][0]["message"]
    assert await count_requests(app, "bulky") == 0


async def test_past_the_models_backlog_bound_submits_get_503_with_retry_after(
    app: FastAPI, client: httpx.AsyncClient
) -> None:
    board = app.state.services.adapters.loadboard
    snapshot = LoadSnapshot(
        model=ECHO,
        at=time.time(),
        slots=1,
        slot_free_at=(time.time() + 0.1,),
        pending_interactive=300,
        pending_bulk=0,
        queued_interactive=100,
        queued_bulk=5000,
        batch_s=0.1,
        max_batch_size=32,
        max_batch_delay_s=0.05,
        arrival_rate=400.0,
    )
    await board.publish(snapshot)
    await board.read(ECHO)
    refused = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "late"}, headers=keys.auth()
    )
    assert refused.status_code == 503, refused.text
    problem = refused.json()
    # 1 slot x 32 per 0.1 s = 320/s; bound 1 s of it = 320; 400 waiting.
    assert problem["limit_name"] == "max_backlog" and problem["limit"] == 320
    assert problem["backlog"] == 400 and problem["capacity_per_s"] == 320.0
    assert int(refused.headers["retry-after"]) == 2  # (400 - 320 + 1) / 320 + 1, rounded up
    # The bulk lane is bounded by the bulk quota, not by the interactive backlog.
    bulk = await client.post(
        "/v1/requests", json={"model": ECHO, "input": "b", "lane": "bulk"}, headers=keys.auth()
    )
    assert bulk.status_code == 202


async def test_a_new_deployment_gets_one_first_key_and_the_cli_manages_keys(
    tmp_path: Path,
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/keys.sqlite3"
    upgrade(url)
    engine = create_engine(url)
    store = JobStore(engine)
    first = await first_key(store)
    assert first is not None and apikeys.key_id_of(first)
    assert await first_key(store) is None  # once only
    await engine.dispose()
    runner = CliRunner()
    with_sqlite = {  # the embedded database under BATCHSERVE_HOME
        "BATCHSERVE_HOME": str(tmp_path),
        "BATCHSERVE_DATABASE_URL": None,
        "BATCHSERVE_BROKER_URL": None,
        "BATCHSERVE_REDIS_URL": None,
    }
    made = runner.invoke(
        cli_app, ["keys", "create", "--tenant", "acme", "--weight", "3", "--json"], env=with_sqlite
    )
    assert made.exit_code == 0, made.output
    created = json.loads(made.stdout)
    assert created["tenant"] == "acme" and created["weight"] == 3.0
    listed = json.loads(runner.invoke(cli_app, ["keys", "list", "--json"], env=with_sqlite).stdout)
    assert created["key"] not in json.dumps(listed)  # the list never shows a key
    assert {k["key_id"] for k in listed["keys"]} >= {created["key_id"]}
    revoked = runner.invoke(cli_app, ["keys", "revoke", created["key"]], env=with_sqlite)
    assert revoked.exit_code == 0 and created["key_id"] in revoked.output
    again = runner.invoke(cli_app, ["keys", "revoke", created["key_id"]], env=with_sqlite)
    assert again.exit_code == 1
    bad = runner.invoke(cli_app, ["keys", "create", "--tenant", "no spaces"], env=with_sqlite)
    assert bad.exit_code == 2
