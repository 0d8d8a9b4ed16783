"""The operator endpoints of the API (its ops listener's app), on real servers: ``/metrics``,
``/dashboard`` and ``/dashboard/data``, none of them on the public app; refusals counted by
reason whichever layer refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from batchserve.api.main import create_ops_app
from batchserve.core.settings import Settings
from tests.support.inprocess import asgi_client


@pytest.fixture
async def ops(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The operators' listener: no key, and never on the public port."""
    async with asgi_client(create_ops_app(app), authed=False) as http:
        yield http


async def test_the_public_app_has_no_operator_endpoint(
    client: httpx.AsyncClient, ops: httpx.AsyncClient
) -> None:
    for path in ("/metrics", "/dashboard", "/dashboard/data"):
        assert (await client.get(path)).status_code == 404, path
        assert (await ops.get(path)).status_code == 200, path


async def scrape(client: httpx.AsyncClient) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def rejected(scrape: dict[tuple[str, frozenset[tuple[str, str]]], float], reason: str) -> float:
    return scrape.get(("batchserve_rejections_total", frozenset({("reason", reason)})), 0.0)


async def test_refusals_are_counted_by_reason_at_every_layer(
    client: httpx.AsyncClient, ops: httpx.AsyncClient, settings: Settings
) -> None:
    before = await scrape(ops)
    too_large = await client.post(
        "/v1/requests", json={"model": "echo-100ms", "input": "x" * (settings.max_body_bytes + 1)}
    )
    invalid = await client.post("/v1/requests", json={"model": "echo-100ms", "input": ""})
    unknown = await client.post("/v1/requests", json={"model": "nope", "input": "x"})
    openai = await client.post("/v1/chat/completions", json={"model": "echo-100ms"})
    assert [r.status_code for r in (too_large, invalid, unknown)] == [413, 422, 404]
    assert openai.status_code == 400
    listed = await client.get("/v1/requests", params={"limit": 0})  # not a submission
    assert listed.status_code == 422
    after = await scrape(ops)
    for reason in ("body_too_large", "invalid_input", "model_not_found"):
        assert rejected(after, reason) == rejected(before, reason) + 1, reason
    openai_reason = openai.json()["error"]["code"] or openai.json()["error"]["type"]
    assert rejected(after, openai_reason) == rejected(before, openai_reason) + 1


async def test_metrics_show_admissions_and_the_queue_the_store_holds(
    client: httpx.AsyncClient, ops: httpx.AsyncClient
) -> None:
    before = await scrape(ops)
    for i in range(3):
        assert (
            await client.post("/v1/requests", json={"model": "echo-100ms", "input": f"{i}"})
        ).status_code == 202
    await asyncio.sleep(1.1)  # the deployment's gauges are cached for a second
    after = await scrape(ops)
    admitted = frozenset({("model", "echo-100ms"), ("lane", "interactive")})
    key = ("batchserve_admissions_total", admitted)
    assert after[key] == before.get(key, 0.0) + 3
    assert after[("batchserve_queue_depth", admitted)] == 3  # no batcher runs here
    assert after[("batchserve_queue_oldest_age_seconds", admitted)] >= 0


async def test_dashboard_page_and_its_data(
    client: httpx.AsyncClient, ops: httpx.AsyncClient
) -> None:
    page = await ops.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "dashboard/data" in page.text and "<script" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from the network
    await client.post("/v1/requests", json={"model": "echo-100ms", "input": "x"})
    data = (await ops.get("/dashboard/data")).json()
    echo = next(m for m in data["models"] if m["name"] == "echo-100ms")
    assert echo["queued"] == 1 and echo["gauges"]["slots_live"] == 0
    assert data["totals"]["queued"] == 1 and data["window_s"] == 300
    assert len(data["latency_series"]) >= 30
