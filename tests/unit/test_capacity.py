"""The capacity planner on the seeds' example: 1000 requests/s, batches of 32, 100 ms."""

from __future__ import annotations

import pytest

from batchserve.batching.capacity import plan_capacity


def test_seed_example_full_batches() -> None:
    plan = plan_capacity(rate_rps=1000, max_batch=32, batch_time_s=0.1)
    assert plan.per_worker_rps == pytest.approx(320)
    assert plan.min_workers == 4 and plan.recommended_workers == 5
    three = next(o for o in plan.options if o.workers == 3)
    assert three.capacity_rps == pytest.approx(960) and three.utilization > 1
    assert plan.min_utilization == pytest.approx(1000 / 1280)
    assert plan.recommended_utilization == pytest.approx(0.625)
    assert "3 give only 960/s" in plan.explain()


def test_half_full_batches_halve_a_workers_capacity() -> None:
    plan = plan_capacity(rate_rps=1000, max_batch=32, batch_time_s=0.1, mean_batch=16)
    assert plan.per_worker_rps == pytest.approx(160)
    assert plan.min_workers == 7 and plan.recommended_workers == 9
    assert "2.0 times the workers" in plan.explain()


@pytest.mark.parametrize("kwargs", [{"rate_rps": 0}, {"headroom": 1.0}, {"mean_batch": 64}])
def test_nonsense_is_refused(kwargs: dict[str, float]) -> None:
    args = {"rate_rps": 100.0, "max_batch": 32, "batch_time_s": 0.1, **kwargs}
    with pytest.raises(ValueError):
        plan_capacity(**args)  # type: ignore[arg-type]
