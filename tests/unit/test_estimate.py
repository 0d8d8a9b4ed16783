"""The learned batch-time estimate recovers a batch-time law from observed batches."""

from __future__ import annotations

import random

import pytest

from batchserve.batching.estimate import (
    BatchObservation,
    BatchShape,
    FixedBatchTime,
    LearnedBatchTime,
    held_out_error,
)


def true_time(shape: BatchShape) -> float:
    # 50 ms fixed, 0.2 ms per prompt token, 20 ms per decode step plus 2 ms per row per step.
    return 0.05 + 0.0002 * shape.prompt_tokens + shape.max_new_tokens * (0.02 + 0.002 * shape.size)


def observations(count: int, rng: random.Random, noise: float = 0.05) -> list[BatchObservation]:
    out = []
    for _ in range(count):
        size = rng.randint(1, 16)
        shape = BatchShape(size, size * rng.randint(10, 400), rng.choice([16, 64, 128, 256]))
        out.append(BatchObservation(shape, true_time(shape) * rng.uniform(1 - noise, 1 + noise)))
    return out


def test_answers_with_the_prior_until_it_has_seen_enough() -> None:
    model = LearnedBatchTime(FixedBatchTime(3.0), min_observations=8)
    model.observe_all(observations(5, random.Random(1)))
    assert model.batch_s(BatchShape(4, 100, 64)) == 3.0


def test_learns_how_prompts_generations_and_size_cost() -> None:
    model = LearnedBatchTime(FixedBatchTime(3.0))
    model.observe_all(observations(300, random.Random(2)))
    for shape in (BatchShape(1, 50, 16), BatchShape(8, 2000, 128), BatchShape(16, 6000, 256)):
        assert model.batch_s(shape) == pytest.approx(true_time(shape), rel=0.1)


def test_held_out_error_is_small_for_a_law_it_can_express() -> None:
    error = held_out_error(observations(400, random.Random(3)), FixedBatchTime(3.0))
    assert error is not None and error.count == 80
    assert error.median < 0.05 and error.p90 < 0.1


def test_the_fixed_model_stays_fixed() -> None:
    assert FixedBatchTime(0.1).batch_s(BatchShape(32, 10_000, 512)) == 0.1
