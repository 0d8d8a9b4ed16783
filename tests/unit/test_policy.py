"""The batching policy, stepped with a fake clock (seconds as plain numbers)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from batchserve.batching.estimate import FixedBatchTime
from batchserve.batching.policy import Load, Pending, PolicyConfig, decide
from batchserve.core.domain import Lane

T = FixedBatchTime(0.100)
SEED = PolicyConfig(kind="timer", max_batch_size=4, max_batch_delay_s=0.010)


def req(name: str, at: float, deadline: float = 1e9, **kw: object) -> Pending:
    return Pending(id=name, arrived_at=at, deadline=deadline, **kw)  # type: ignore[arg-type]


def ids(decision_batch: tuple[Pending, ...]) -> list[str]:
    return [p.id for p in decision_batch]


def test_full_batch_leaves_at_once() -> None:
    pending = [req(n, 0.0) for n in "ABCD"]
    decision = decide(pending, 0.0, 1, SEED, T)
    assert [ids(b) for b in decision.batches] == [["A", "B", "C", "D"]]


def test_partial_batch_waits_for_the_oldest_requests_timer() -> None:
    a = req("A", 0.000)
    decision = decide([a], 0.000, 1, SEED, T)
    assert decision.batches == ()
    assert decision.wake_at == 0.010
    b = req("B", 0.007)
    decision = decide([a, b], 0.007, 1, SEED, T)
    assert decision.batches == ()
    assert decision.wake_at == 0.010  # B's arrival does not restart A's clock
    decision = decide([a, b], 0.010, 1, SEED, T)
    assert [ids(b) for b in decision.batches] == [["A", "B"]]


def test_nothing_forms_while_every_slot_is_busy() -> None:
    pending = [req(f"r{i}", 0.0) for i in range(100)]
    assert decide(pending, 5.0, 0, SEED, T).batches == ()


def test_one_batch_per_free_slot_never_more() -> None:
    pending = [req(f"r{i:03}", 0.0) for i in range(100)]
    one = decide(pending, 0.0, 1, SEED, T)
    assert len(one.batches) == 1 and len(one.batches[0]) == 4
    two = decide(pending, 0.0, 2, SEED, T)
    assert [len(b) for b in two.batches] == [4, 4]
    assert not set(ids(two.batches[0])) & set(ids(two.batches[1]))


def test_overdue_partial_batch_leaves_the_moment_a_slot_frees() -> None:
    e = req("E", 0.001)
    assert decide([e], 0.050, 0, SEED, T).batches == ()  # worker busy until 0.100
    decision = decide([e], 0.100, 1, SEED, T)
    assert [ids(b) for b in decision.batches] == [["E"]]  # no fresh 10 ms timer


def test_request_that_cannot_meet_its_deadline_is_expired_not_run() -> None:
    e = req("E", 0.001, deadline=0.150)
    early = decide([e], 0.001, 0, SEED, T)
    assert early.expire == () and early.wake_at == pytest.approx(
        0.050, abs=1e-5
    )  # last meetable moment
    late = decide([e], 0.100, 1, SEED, T)
    assert ids(late.expire) == ["E"] and late.batches == ()


def test_deadline_at_risk_sends_a_partial_batch_before_its_timer() -> None:
    a = req("A", 0.000, deadline=0.105)
    decision = decide([a], 0.000, 1, SEED, T)
    assert decision.batches == () and decision.wake_at == pytest.approx(0.005)
    assert decision.wake_at is not None
    assert [ids(b) for b in decide([a], decision.wake_at, 1, SEED, T).batches] == [["A"]]


def test_interactive_before_bulk_and_fifo_within_a_lane() -> None:
    pending = [
        req("b1", 0.000, lane=Lane.BULK),
        req("b2", 0.001, lane=Lane.BULK),
        req("b3", 0.002, lane=Lane.BULK),
        req("i2", 0.004),
        req("i1", 0.003),
    ]
    decision = decide(pending, 0.0, 1, PolicyConfig(kind="greedy", max_batch_size=4), T)
    assert [ids(b) for b in decision.batches] == [["i1", "i2", "b1", "b2"]]


def test_retry_groups_stay_apart_and_leave_at_once() -> None:
    pending = [
        req("x1", 0.0, group="g1"),
        req("x2", 0.0, group="g1"),
        req("y1", 0.0, group="g2"),
        req("n1", 0.0),
    ]
    decision = decide(pending, 0.0, 3, SEED, T)
    assert sorted(ids(b) for b in decision.batches) == [["x1", "x2"], ["y1"]]
    assert decision.wake_at == 0.010  # n1 waits for company as usual


def test_token_budget_closes_a_batch_early() -> None:
    config = PolicyConfig(
        kind="timer", max_batch_size=32, max_batch_delay_s=1.0, max_batch_tokens=100
    )
    pending = [req(f"r{i}", 0.0, prompt_tokens=20, max_tokens=20) for i in range(3)]
    decision = decide(pending, 0.0, 1, config, T)
    assert [ids(b) for b in decision.batches] == [["r0", "r1"]]  # r2 would overflow 100 tokens


def test_greedy_sends_whatever_waits_and_size_only_waits_to_be_full() -> None:
    a = req("A", 0.0)
    assert len(decide([a], 0.0, 1, PolicyConfig(kind="greedy", max_batch_size=4), T).batches) == 1
    size_only = PolicyConfig(kind="size-only", max_batch_size=4, max_batch_delay_s=0.010)
    assert decide([a], 5.0, 1, size_only, T).batches == ()


def test_policy_modules_import_no_io_libraries() -> None:
    code = (
        "import sys, batchserve.batching.policy, batchserve.batching.estimate\n"
        "bad = [m for m in ('sqlalchemy','kombu','celery','redis','torch','aio_pika','httpx')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


ADAPTIVE = PolicyConfig(kind="adaptive", max_batch_size=32, max_batch_delay_s=1.0)


def test_adaptive_paces_partial_batches_one_slot_period_apart() -> None:
    # 4 slots, 100 ms batches: a slot frees every 25 ms in steady state.
    load = Load(arrival_rate=100.0, busy_until=(0.09,), last_dispatch_at=-0.01)
    pending = [req("A", 0.000)]
    decision = decide(pending, 0.000, 3, ADAPTIVE, T, load)
    assert decision.batches == () and decision.wake_at == pytest.approx(0.015)
    assert decision.wake_at is not None
    assert len(decide(pending, decision.wake_at, 3, ADAPTIVE, T, load).batches) == 1


def test_adaptive_goes_at_once_when_nothing_left_recently() -> None:
    load = Load(arrival_rate=10.0, last_dispatch_at=-5.0)
    assert len(decide([req("A", 0.0)], 0.0, 4, ADAPTIVE, T, load).batches) == 1


def test_adaptive_fills_partial_batches_near_saturation() -> None:
    # One slot, 300/s arriving: keeping up needs 30 a batch; 10 waiting is not enough yet.
    load = Load(arrival_rate=300.0, last_dispatch_at=-1.0)
    pending = [req(f"r{i}", 0.0) for i in range(10)]
    assert decide(pending, 0.005, 1, ADAPTIVE, T, load).batches == ()
    pending += [req(f"s{i}", 0.005) for i in range(21)]
    assert len(decide(pending, 0.01, 1, ADAPTIVE, T, load).batches[0]) == 31
    # ... and never holds anyone longer than one batch time.
    assert len(decide(pending[:10], 0.1, 1, ADAPTIVE, T, load).batches) == 1


def test_length_classes_keep_short_answers_out_of_long_batches() -> None:
    config = PolicyConfig(kind="greedy", max_batch_size=8, length_edges=(32, 256))
    pending = [
        req("long1", 0.000, max_tokens=512),
        req("short1", 0.001, max_tokens=16),
        req("mid", 0.002, max_tokens=100),
        req("short2", 0.003, max_tokens=32),
    ]
    decision = decide(pending, 0.01, 3, config, T)
    assert [ids(b) for b in decision.batches] == [["long1"], ["short1", "short2"], ["mid"]]
    one_slot = decide(pending, 0.01, 1, config, T)
    assert [ids(b) for b in one_slot.batches] == [["long1"]]  # FIFO across classes: no starving


def test_tenants_take_turns_by_weight() -> None:
    config = PolicyConfig(kind="greedy", max_batch_size=6)
    burst = [req(f"big{i}", 0.0 + i * 1e-3, tenant="big") for i in range(20)]
    small = [req(f"small{i}", 0.1 + i * 1e-3, tenant="small") for i in range(2)]
    decision = decide(burst + small, 1.0, 1, config, T)
    assert ids(decision.batches[0]) == ["big0", "small0", "big1", "small1", "big2", "big3"]
    weighted = decide(burst + small, 1.0, 1, config, T, Load(weights={"big": 2.0}))
    assert ids(weighted.batches[0]) == ["big0", "big1", "small0", "big2", "big3", "small1"]


def test_fair_share_keeps_interactive_before_bulk() -> None:
    config = PolicyConfig(kind="greedy", max_batch_size=3)
    pending = [
        req("a-bulk", 0.0, tenant="a", lane=Lane.BULK),
        req("b-int", 0.5, tenant="b"),
        req("a-int", 0.6, tenant="a"),
    ]
    assert ids(decide(pending, 1.0, 1, config, T).batches[0]) == ["b-int", "a-int", "a-bulk"]
