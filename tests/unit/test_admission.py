"""Admission's completion estimate, from the work ahead and the slots' free times."""

from __future__ import annotations

import pytest

from batchserve.batching.eta import estimate_finish


def test_idle_slot_and_nothing_ahead_is_one_batch_plus_the_delay() -> None:
    finish = estimate_finish(
        now=0.0, ahead=0, slot_free_at=[0.0], max_batch_size=32, batch_s=0.1, max_batch_delay_s=0.01
    )
    assert finish == pytest.approx(0.11)


def test_busy_slot_delays_the_start_the_seed_exercise() -> None:
    # The seeds' E: arrives at 1 ms while the only worker is busy until 100 ms: done at 200 ms.
    finish = estimate_finish(now=0.001, ahead=0, slot_free_at=[0.1], max_batch_size=4, batch_s=0.1)
    assert finish == pytest.approx(0.2)


def test_a_backlog_spreads_over_the_slots() -> None:
    # 128 ahead at 32 a batch = 4 full batches; 2 idle slots run them in 2 rounds; ours is 3rd.
    finish = estimate_finish(
        now=0.0, ahead=128, slot_free_at=[0.0, 0.0], max_batch_size=32, batch_s=0.1
    )
    assert finish == pytest.approx(0.3)


def test_no_workers_means_no_estimate() -> None:
    assert (
        estimate_finish(now=0.0, ahead=0, slot_free_at=[], max_batch_size=32, batch_s=0.1) is None
    )
