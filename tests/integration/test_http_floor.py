"""``scripts/bench_http_floor.py`` serves its two floors under each server it compares."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_http_floor


@pytest.mark.parametrize("server", bench_http_floor.SERVERS)
@pytest.mark.parametrize("kind", bench_http_floor.FLOORS)
def test_each_server_answers_each_floor(server: str, kind: str) -> None:
    """A short step: the server starts from the script's command, answers every submit with
    its 202, and its CPU (over its processes) is counted: about a hundred submits, tens of
    milliseconds of CPU, several of the clock ticks it is counted in."""
    steps = bench_http_floor.run_floor(kind, "off", [100.0], 1.0, 7, server, warm_up_s=0)
    (step,) = steps
    assert step["sent"] > 0 and step["answered"] == step["sent"] and step["errors"] == 0
    assert step["server_cpu_ms"] > 0


def test_the_factories_start_the_floors_as_the_roles_start() -> None:
    """granian imports the apps through factories: the bare ASGI callable and a FastAPI app,
    each made after the collector is tuned as batchserve's roles tune it."""
    import gc

    from batchserve.core.loops import GC_YOUNG_THRESHOLD

    before = gc.get_threshold()
    try:
        assert callable(bench_http_floor.asgi_app())
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
        assert hasattr(bench_http_floor.fastapi_app(), "router")
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
