"""The garbage collector's pauses, timed in every role that runs on ``loops.run``."""

from __future__ import annotations

import gc

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
