"""``batchserve capacity --model``: the plan from the batch times workers reported."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from cli.main import app
from core.db import create_engine
from core.domain import from_epoch
from core.settings import Settings
from core.tables import batches_table
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
    await add_batches(engine, "smollm2-135m", shapes * 2)
    await engine.dispose()
    for name, value in {
        "BATCHSERVE_DATABASE_URL": str(settings.database_url),
        "BATCHSERVE_BROKER_URL": str(settings.broker_url),
        "BATCHSERVE_REDIS_URL": str(settings.redis_url),
        "BATCHSERVE_MODELS": str(TEST_MODELS),
    }.items():
        monkeypatch.setenv(name, value)
    args = ["capacity", "--model", "smollm2-135m", "--rate", "10", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    # Full batches (8) of the median length (40 steps): 0.5 + 0.01 * 40 * 8 = 3.7 s.
    assert plan["max_batch"] == 8
    assert plan["batch_time_ms"] == pytest.approx(3700, rel=0.02)
    assert plan["measured"]["batches"] == 16
    assert plan["min_workers"] == 5  # 10/s over 8 / 3.7 s = 2.16/s a worker


async def test_capacity_for_a_model_without_batches_says_so(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BATCHSERVE_DATABASE_URL", str(settings.database_url))
    monkeypatch.setenv("BATCHSERVE_BROKER_URL", str(settings.broker_url))
    monkeypatch.setenv("BATCHSERVE_REDIS_URL", str(settings.redis_url))
    monkeypatch.setenv("BATCHSERVE_MODELS", str(TEST_MODELS))
    result = CliRunner().invoke(app, ["capacity", "--model", "echo-100ms", "--rate", "10"])
    assert result.exit_code != 0 and "no finished batches" in result.output
