"""The HTTP contract, run twice: against ``batchserve serve`` in the embedded mode (a real
subprocess with no server configured: SQLite file, in-process queue) and against the full stack
(API, batcher, maintenance and Celery workers on Postgres, RabbitMQ and Redis).

One service per mode serves the whole module; each test is a tenant of its own (its own API
key), so what one test submits never shows in another's lists.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchserve.cli.keys import create_key_blocking
from batchserve.testing.deployment import ROOT, Stack, free_port, terminate
from tests.conftest import server_env
from tests.support import servers

ECHO = "echo-100ms"
SLOW = "echo-slow"  # one batch takes a second: long enough to see a request before it ends
CONTRACT_MODELS = """
[models.echo-100ms]
backend = "fixed"
batch_time_ms = 100
max_batch_size = 32
policy = "adaptive"

[models.echo-slow]
backend = "fixed"
batch_time_ms = 1000
max_batch_size = 32
max_batch_delay_ms = 20
policy = "timer"
"""
_tenants = itertools.count(1)


@dataclass
class Service:
    mode: str
    url: str
    database_url: str

    def new_key(self) -> str:
        return create_key_blocking(self.database_url, f"contract-{next(_tenants)}")


def _models_file(directory: Path) -> Path:
    path = directory / "models.toml"
    path.write_text(CONTRACT_MODELS)
    return path


@contextlib.contextmanager
def embedded_service(home: Path) -> Iterator[Service]:
    """``batchserve serve`` with no server configured, as a newcomer would run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env.update(BATCHSERVE_HOME=str(home), BATCHSERVE_MODELS=str(_models_file(home)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "serve.log", "ab")  # noqa: SIM115 - the child owns it
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "batchserve.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--ops-port",
            str(free_port()),
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        give_up = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            assert process.poll() is None, (home / "serve.log").read_text()
            assert time.monotonic() < give_up, "the embedded server did not come up"
            time.sleep(0.2)
        yield Service("embedded", url, f"sqlite+aiosqlite:///{home / 'batchserve.sqlite3'}")
    finally:
        terminate(process, 20)


@contextlib.contextmanager
def full_stack(template_db: str, run_id: str, log_dir: Path) -> Iterator[Service]:
    database = f"{servers.DB_PREFIX}{run_id}_contract"
    servers.create_database(database, template=template_db)
    namespace = f"{run_id}contract"
    env = {
        **os.environ,
        **server_env(servers.pg_url(database), namespace),
        "BATCHSERVE_MODELS": str(_models_file(log_dir)),
    }
    stack = Stack(env=env, log_dir=log_dir)
    try:
        stack.start_all({ECHO: 1, SLOW: 1})
        yield Service("stack", stack.url, servers.pg_url(database))
    finally:
        stack.discard()
        servers.delete_namespace_queues(namespace, [ECHO, SLOW])
        servers.drop_database(database)


@contextlib.contextmanager
def service_of(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[Service]:
    """The service of a module's ``request.param`` mode; ``name`` keeps modules apart."""
    directory = tmp_path_factory.mktemp(f"{name}-{request.param}")
    if request.param == "embedded":
        with embedded_service(directory) as embedded:
            yield embedded
    else:
        template_db = request.getfixturevalue("template_db")
        run_id = request.getfixturevalue("run_id")
        with full_stack(template_db, f"{run_id}{name}", directory) as stack:
            yield stack


@pytest.fixture(scope="module", params=["embedded", "stack"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with service_of(request, tmp_path_factory, "contract") as service:
        yield service


@pytest.fixture
async def client(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    """A client that is a tenant of its own."""
    headers = {"Authorization": f"Bearer {service.new_key()}"}
    async with httpx.AsyncClient(base_url=service.url, timeout=60, headers=headers) as http:
        yield http


def body(**overrides: Any) -> dict[str, Any]:
    return {"model": ECHO, "input": "hello", **overrides}


async def listed(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await client.get("/v1/requests", params={"limit": 1000, **params})
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


async def finished(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        record = (await client.get(f"/v1/requests/{request_id}", params={"wait": 10})).json()
        if record["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return dict(record)
    raise AssertionError(f"{request_id} not finished")


async def test_submit_answers_202_with_location_and_the_result_arrives(
    client: httpx.AsyncClient,
) -> None:
    text = f"contract {uuid.uuid4()}"
    response = await client.post("/v1/requests", json=body(input=text, metadata={"k": "v"}))
    assert response.status_code == 202
    created = response.json()
    assert response.headers["location"] == f"/v1/requests/{created['id']}"
    assert created["status"] == "queued" and created["metadata"] == {"k": "v"}
    record = await finished(client, created["id"])
    assert record["status"] == "succeeded" and record["output"]["text"] == text
    assert record["batch_id"] and record["attempts"] == 1
    timings = record["timings"]
    assert timings["model_ms"] >= 100 and timings["total_ms"] >= timings["model_ms"]


async def test_long_poll_returns_at_the_change_or_times_out_with_the_state(
    client: httpx.AsyncClient,
) -> None:
    quick = (await client.post("/v1/requests", json=body())).json()["id"]
    started = time.monotonic()
    done = await client.get(f"/v1/requests/{quick}", params={"wait": 20})
    assert done.json()["status"] == "succeeded"
    assert time.monotonic() - started < 5  # woken by the change, not by the 20 s timeout

    slow = (await client.post("/v1/requests", json=body(model=SLOW))).json()["id"]
    started = time.monotonic()
    waiting = await client.get(f"/v1/requests/{slow}", params={"wait": 0.4})
    assert waiting.status_code == 200 and waiting.json()["status"] in ("queued", "running")
    assert 0.4 <= time.monotonic() - started < 3
    changed = await client.get(f"/v1/requests/{slow}", params={"wait": 20, "until": "change"})
    assert changed.json()["status"] in ("running", "succeeded")
    too_long = await client.get(f"/v1/requests/{slow}", params={"wait": 3600})
    assert too_long.status_code == 422 and too_long.json()["field"] == "wait"
    assert (await finished(client, slow))["status"] == "succeeded"


async def test_cancel_is_final_idempotent_and_refused_once_finished(
    client: httpx.AsyncClient,
) -> None:
    slow = (await client.post("/v1/requests", json=body(model=SLOW))).json()["id"]
    cancelled = await client.post(f"/v1/requests/{slow}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = await client.post(f"/v1/requests/{slow}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    await asyncio.sleep(1.5)  # past the end of the batch it may have been running in
    record = (await client.get(f"/v1/requests/{slow}")).json()
    assert record["status"] == "cancelled" and record["output"] is None
    quick = (await client.post("/v1/requests", json=body())).json()["id"]
    await finished(client, quick)
    late = await client.post(f"/v1/requests/{quick}/cancel")
    assert late.status_code == 409
    assert (await client.post(f"/v1/requests/{uuid.uuid4()}/cancel")).status_code == 404


async def test_list_pages_newest_first_with_a_cursor_and_filters(
    client: httpx.AsyncClient,
) -> None:
    ids = [
        (await client.post("/v1/requests", json=body(input=f"r{i}"))).json()["id"] for i in range(5)
    ]
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
    for request_id in ids:
        await finished(client, request_id)
    assert len(await listed(client, status="succeeded")) == 5
    assert await listed(client, status="cancelled") == []
    assert len(await listed(client, model=ECHO)) == 5


async def test_idempotency_replays_refuses_another_body_and_admits_a_burst_once(
    client: httpx.AsyncClient,
) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = await client.post("/v1/requests", json=body(), headers=headers)
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    replay = await client.post(
        "/v1/requests",
        content=b'{ "input": "hello",   "model": "echo-100ms" }',  # same body, other spelling
        headers={**headers, "content-type": "application/json"},
    )
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]
    other = await client.post("/v1/requests", json=body(input="different"), headers=headers)
    assert other.status_code == 422 and other.json()["code"] == "idempotency_key_reused"
    burst = await asyncio.gather(
        *(
            client.post("/v1/requests", json=body(), headers={"Idempotency-Key": "burst"})
            for _ in range(20)
        )
    )
    assert {r.status_code for r in burst} <= {202, 409}
    assert len({r.json()["id"] for r in burst if r.status_code == 202}) == 1
    assert len(await listed(client)) == 2


async def test_idempotency_keys_and_requests_belong_to_their_tenant(
    service: Service, client: httpx.AsyncClient
) -> None:
    other_key = service.new_key()
    other = {"Authorization": f"Bearer {other_key}"}
    mine = await client.post("/v1/requests", json=body(), headers={"Idempotency-Key": "same"})
    theirs = await client.post(
        "/v1/requests", json=body(), headers={**other, "Idempotency-Key": "same"}
    )
    assert mine.status_code == theirs.status_code == 202
    assert mine.json()["id"] != theirs.json()["id"]
    assert (await client.get(f"/v1/requests/{theirs.json()['id']}")).status_code == 404
    assert (
        await client.get(f"/v1/requests/{theirs.json()['id']}", headers=other)
    ).status_code == 200


BAD_INPUT: list[tuple[dict[str, Any], int, str]] = [
    (body(input=""), 422, "input"),
    ({"model": ECHO}, 422, "input"),
    (body(messages=[{"role": "user", "content": "x"}]), 422, "messages"),
    (body(model="no-such-model"), 404, "model"),
    (body(params={"max_tokens": 0}), 422, "params.max_tokens"),
    (body(params={"temperature": "hot"}), 422, "params.temperature"),
    (body(input=123), 422, "input"),
    (body(timeout_s=-1), 422, "timeout_s"),
    (body(lane="vip"), 422, "lane"),
    (body(unknown_field=1), 422, "unknown_field"),
    (body(webhook_url="ftp://x"), 422, "webhook_url"),
]


async def test_bad_input_is_a_clear_problem_and_creates_nothing(
    client: httpx.AsyncClient,
) -> None:
    for payload, status, field in BAD_INPUT:
        response = await client.post("/v1/requests", json=payload)
        assert response.status_code == status, (payload, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        problem = response.json()
        assert problem["status"] == status and problem["type"].startswith("urn:batchserve:problem:")
        assert field in (problem.get("field"), *(e["field"] for e in problem.get("errors", [])))
    malformed = await client.post(
        "/v1/requests",
        content=b'{"model": "echo-100ms", "input": ',
        headers={"content-type": "application/json"},
    )
    assert malformed.status_code == 400 and malformed.json()["code"] == "malformed_json"
    assert await listed(client) == []


async def test_health_readiness_and_models(service: Service, client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    # What OpenAI-compatible benchmark clients (guidellm) probe, without a key.
    health = await client.get("/health", headers={"Authorization": ""})
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["status"] == "ready"
    in_process = service.mode == "embedded"
    assert (ready["checks"]["broker"] == "ok (in-process)") is in_process
    models = (await client.get("/v1/models")).json()
    assert {ECHO, SLOW} <= {m["id"] for m in models["data"]}
    assert (await client.get("/v1/models/nope")).status_code == 404
