"""``batchserve capacity --model``: the plan from the batch times workers reported."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from batchserve.cli.main import app
from batchserve.core.db import create_engine
from batchserve.core.domain import from_epoch
from batchserve.core.settings import Settings
from batchserve.core.slots import SlotRegistration
from batchserve.core.tables import batches_table, requests_table
from tests.conftest import TEST_MODELS


async def add_batches(
    engine: AsyncEngine, model: str, shapes: list[tuple[int, int, float]]
) -> None:
    now = time.time()
    rows = [
        {
            "id": uuid.uuid4(),
            "model": model,
            "size": size,
            "attempt": 1,
            "prompt_tokens": 20 * size,
            "max_new_tokens": steps,
            "generated_tokens": steps * size,
            "model_ms": seconds * 1000.0,
            "dispatched_at": from_epoch(now - 10 + i),
            "started_at": from_epoch(now - 10 + i),
            "finished_at": from_epoch(now - 9 + i),
            "lease_expires_at": from_epoch(now),
            "outcome": "succeeded",
        }
        for i, (size, steps, seconds) in enumerate(shapes)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(batches_table), rows)


async def test_capacity_for_a_model_uses_its_measured_batch_times(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model whose batches take 0.5 s fixed + 10 ms per decode step per row.
    shapes = [
        (size, steps, 0.5 + 0.01 * steps * size) for size in (1, 2, 4, 8) for steps in (16, 64)
    ]
    engine = create_engine(str(settings.database_url))
    await add_batches(engine, "echo-slow", shapes * 2)
    await engine.dispose()
    for name, value in {
        "BATCHSERVE_DATABASE_URL": str(settings.database_url),
        "BATCHSERVE_BROKER_URL": str(settings.broker_url),
        "BATCHSERVE_REDIS_URL": str(settings.redis_url),
        "BATCHSERVE_MODELS": str(TEST_MODELS),
    }.items():
        monkeypatch.setenv(name, value)
    args = ["capacity", "--model", "echo-slow", "--rate", "10", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    # Full batches (32) of the median length (40 steps): 0.5 + 0.01 * 40 * 32 = 13.3 s.
    assert plan["max_batch"] == 32
    assert plan["batch_time_ms"] == pytest.approx(13300, rel=0.02)
    assert plan["measured"]["batches"] == 16
    assert plan["min_workers"] == 5  # 10/s over 32 / 13.3 s = 2.41/s a worker


async def add_finished_requests(
    engine: AsyncEngine, model: str, shapes: list[tuple[int, int, float]]
) -> None:
    now = time.time()
    rows = [
        {
            "id": uuid.uuid4(),
            "tenant": "tests",
            "model": model,
            "lane": "interactive",
            "state": "succeeded",
            "input": "hello",
            "params": {},
            "est_prompt_tokens": prompt,
            "max_tokens": generated,
            "deadline": from_epoch(now + 600),
            "attempts": 1,
            "failures": 0,
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "model_ms": seconds * 1000.0,
            "created_at": from_epoch(now - 20 + i),
            "finished_at": from_epoch(now - 10 + i),
        }
        for i, (prompt, generated, seconds) in enumerate(shapes)
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(requests_table), rows)


async def test_capacity_for_an_engine_model_uses_its_measured_speed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Typical request: 200 prompt tokens, 100 generated. The live engine (16 sequences) measured
    # 1,000 prefill tokens/s and 160 ms a full decode step: a request costs the engine
    # 200 / 1000 + 100 x 0.16 / 16 = 1.2 s, so one engine serves 1 / 1.2 = 0.83 requests/s.
    engine = create_engine(str(settings.database_url))
    await add_finished_requests(
        engine, "smollm2-135m", [(200, 100, 9.0), (150, 80, 7.0), (250, 120, 11.0)]
    )
    await engine.dispose()
    registration = SlotRegistration(
        str(settings.redis_url),
        settings.key_prefix,
        "smollm2-135m",
        "engine-1",
        16,
        tokens=45_000,
        profile={
            "prefill_tokens_per_s": 1000.0,
            "decode_step_s": 0.16,
            "decode_step_s_alone": 0.05,
        },
    )
    registration.beat(60)
    for name, value in {
        "BATCHSERVE_DATABASE_URL": str(settings.database_url),
        "BATCHSERVE_BROKER_URL": str(settings.broker_url),
        "BATCHSERVE_REDIS_URL": str(settings.redis_url),
        "BATCHSERVE_NAMESPACE": settings.namespace,
        "BATCHSERVE_MODELS": str(TEST_MODELS),
    }.items():
        monkeypatch.setenv(name, value)
    try:
        args = ["capacity", "--model", "smollm2-135m", "--rate", "2", "--json"]
        result = CliRunner().invoke(app, args)
    finally:
        registration.withdraw()
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["measured"]["engine_s_per_request"] == pytest.approx(1.2)
    assert plan["per_worker_rps"] == pytest.approx(1 / 1.2)
    assert plan["min_workers"] == 3  # 2/s over 0.83/s an engine


async def test_capacity_for_an_engine_model_without_a_live_engine_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {
        "BATCHSERVE_DATABASE_URL": str(settings.database_url),
        "BATCHSERVE_BROKER_URL": str(settings.broker_url),
        "BATCHSERVE_REDIS_URL": str(settings.redis_url),
        "BATCHSERVE_NAMESPACE": settings.namespace,
        "BATCHSERVE_MODELS": str(TEST_MODELS),
    }.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, ["capacity", "--model", "smollm2-135m", "--rate", "2"])
    assert result.exit_code != 0 and "no engine of smollm2-135m is running" in result.output


async def test_capacity_for_a_model_without_batches_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHSERVE_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("BATCHSERVE_BROKER_URL", str(settings.broker_url))
    monkeypatch.setenv("BATCHSERVE_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("BATCHSERVE_MODELS", str(TEST_MODELS))
    result = CliRunner().invoke(app, ["capacity", "--model", "echo-100ms", "--rate", "10"])
    assert result.exit_code != 0 and "no finished batches" in result.output
