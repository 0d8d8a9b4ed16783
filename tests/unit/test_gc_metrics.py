"""The garbage collector's pauses, timed in every role that runs on ``loops.run``."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from batchserve.core.metrics import watch_gc


def full_collections() -> tuple[float, float]:
    labels = {"generation": "2"}
    count = REGISTRY.get_sample_value("batchserve_gc_pause_seconds_count", labels) or 0.0
    total = REGISTRY.get_sample_value("batchserve_gc_pause_seconds_sum", labels) or 0.0
    return count, total


def test_every_collection_is_timed_by_generation() -> None:
    watch_gc()
    watch_gc()  # once per process, however often asked
    count, total = full_collections()
    gc.collect()
    gc.collect()
    after_count, after_total = full_collections()
    assert after_count == count + 2
    assert after_total > total


def test_the_api_runs_with_its_start_up_frozen_and_a_higher_young_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``batchserve api`` freezes what start-up made and collects the youngest generation at
    ``GC_YOUNG_THRESHOLD`` (docs/frontdoor.md, "The API's garbage collector")."""
    from batchserve.cli import roles
    from batchserve.core import loops
    from batchserve.core.settings import Settings

    seen: dict[str, object] = {}

    def run(main: Any) -> None:
        seen["threshold"] = gc.get_threshold()[0]
        seen["frozen"] = gc.get_freeze_count()
        main.close()

    threshold = gc.get_threshold()
    monkeypatch.setattr(loops, "run", run)
    try:
        roles.run_api(Settings(), "127.0.0.1", 0)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert seen["threshold"] == loops.GC_YOUNG_THRESHOLD == 10_000
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000  # the imports, at least


async def test_the_embedded_mode_serves_with_its_start_up_frozen_and_the_roles_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``batchserve serve`` with no servers tunes its one process's collector as every role
    does, once its stack and app are made: at CPython's defaults its passes traversed every
    model and module it had loaded."""
    from batchserve.cli import embedded
    from batchserve.core import loops
    from batchserve.core.settings import Settings

    registry = tmp_path / "models.toml"
    registry.write_text('[models.echo-gc]\nbackend = "fixed"\nbatch_time_ms = 100\n')
    settings = Settings(
        database_url=None, broker_url=None, redis_url=None, home=tmp_path, models=registry
    )
    seen: dict[str, int] = {}

    async def serve(*_: Any, **__: Any) -> None:
        seen["threshold"] = gc.get_threshold()[0]
        seen["frozen"] = gc.get_freeze_count()

    monkeypatch.setattr(embedded, "serve_api", serve)
    threshold = gc.get_threshold()
    try:
        await embedded.run_embedded(settings, "127.0.0.1", 0)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert seen["threshold"] == loops.GC_YOUNG_THRESHOLD
    assert seen["frozen"] > 10_000  # the imports, at least
