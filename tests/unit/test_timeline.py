"""The batcher's view of worker slots, with batches sent just before a slot frees."""

from __future__ import annotations

import random
import uuid

from batchserve.batching.timeline import LeadTuner, SlotTimeline


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]


def test_idle_slots_take_batches_then_none_is_free() -> None:
    timeline = SlotTimeline(lead_s=0.02)
    timeline.resize(2)
    a, b = ids(2)
    assert timeline.free_slots(0.0) == 2
    assert timeline.assign(a, 0.0, 0.1) == 0.1
    timeline.assign(b, 0.0, 0.1)
    assert timeline.free_slots(0.05) == 0
    assert timeline.busy_until(0.05) == (0.1, 0.1)


def test_a_slot_counts_as_free_just_before_its_batch_ends() -> None:
    timeline = SlotTimeline(lead_s=0.02)
    timeline.resize(1)
    a, b, c = ids(3)
    timeline.assign(a, 0.0, 0.1)
    assert timeline.free_slots(0.079) == 0
    assert timeline.free_slots(0.081) == 1
    assert timeline.assign(b, 0.081, 0.1) == 0.2  # starts when a ends
    assert timeline.free_slots(0.09) == 0  # one batch waits per slot, never two
    assert timeline.release(a, 0.1, next_run_s=0.1)
    assert timeline.free_slots(0.15) == 0 and timeline.free_slots(0.185) == 1
    timeline.assign(c, 0.185, 0.1)
    assert timeline.release(b, 0.2) and timeline.release(c, 0.3)
    assert timeline.free_slots(0.3) == 1 and len(timeline) == 0


def test_a_batch_that_ends_early_frees_its_slot_at_once() -> None:
    timeline = SlotTimeline()
    timeline.resize(1)
    (a,) = ids(1)
    timeline.assign(a, 0.0, 10.0)
    assert timeline.free_slots(1.0) == 0
    timeline.release(a, 1.0)
    assert timeline.free_slots(1.0) == 1


def test_slots_that_vanish_take_nothing_new() -> None:
    timeline = SlotTimeline(lead_s=0.02)
    timeline.resize(2)
    a, b = ids(2)
    timeline.assign(a, 0.0, 0.1)
    timeline.resize(0)  # the worker died
    assert timeline.free_slots(0.09) == 0
    timeline.release(a, 1.0)
    assert timeline.free_slots(1.0) == 0
    timeline.resize(1)
    assert timeline.free_slots(1.0) == 1
    assert not timeline.release(b, 1.0)  # unknown batch: nothing changes


def test_a_batch_overrunning_its_estimate_never_gets_two_queued_behind_it() -> None:
    timeline = SlotTimeline(lead_s=0.02)
    timeline.resize(1)
    a, b = ids(2)
    timeline.assign(a, 0.0, 0.1)
    timeline.assign(b, 0.09, 0.1)  # queued behind a
    assert timeline.free_slots(0.5) == 0  # a overran; b's estimated end passed: still no slot
    timeline.release(a, 0.6, next_run_s=0.1)
    assert timeline.free_slots(0.69) == 1  # b now runs and is due to end at 0.7


def test_a_batch_placed_twice_keeps_one_slot() -> None:
    # Reconciling can find a batch open in Postgres before its own dispatch has placed it:
    # placing it again must not queue it behind the other slot too, leaving one slot in use.
    timeline = SlotTimeline(lead_s=0.02)
    timeline.resize(2)
    a, b, c = ids(3)
    timeline.assign(a, 0.0, 0.1)
    timeline.assign(b, 0.05, 0.1)
    end = timeline.assign(c, 0.085, 0.1)  # behind a
    assert timeline.assign(c, 0.086, 0.1) == end
    assert timeline.release(a, 0.1, next_run_s=0.1)
    assert timeline.release(b, 0.15)
    assert timeline.free_slots(0.15) == 1  # b's slot is idle


def test_the_lead_settles_where_one_batch_in_ten_comes_late() -> None:
    """Hand-overs of 12 ms give or take 3 (normal): the lead settles near their 90th
    percentile (15.8 ms), from above and from below, and stays within its bounds."""
    rng = random.Random(7)
    for start in (0.03, 0.005):
        tuner = LeadTuner(start, late_share=0.1, step_s=0.0005)
        late = 0
        for n in range(6000):
            hand_over = rng.gauss(0.012, 0.003)
            came_late = tuner.lead_s < hand_over
            tuner.observe(tuner.lead_s - hand_over)
            late += came_late and n >= 3000
        assert abs(tuner.lead_s - 0.0158) < 0.002
        assert 0.06 < late / 3000 < 0.14
    bounded = LeadTuner(0.03, min_s=0.01, max_s=0.05)
    for _ in range(1000):
        bounded.observe(1.0)
    assert bounded.lead_s == 0.01
    for _ in range(1000):
        bounded.observe(-1.0)
    assert bounded.lead_s == 0.05
