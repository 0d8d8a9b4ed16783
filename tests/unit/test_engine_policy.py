"""The pure parts of the engine path: capacity ledger, dispatch decision, cost model, text."""

from __future__ import annotations

import uuid

from batchserve.batching.estimate import (
    BatchObservation,
    BatchShape,
    FixedBatchTime,
    LearnedBatchTime,
    ProfiledSequenceTime,
    SequenceCost,
    sequence_time_limit_s,
)
from batchserve.batching.eta import estimate_engine_finish
from batchserve.batching.ledger import Credit, EngineLedger
from batchserve.batching.policy import Load, Pending, PolicyConfig, decide_engine
from batchserve.core.domain import Lane
from batchserve.models.engine import EngineCapacity, EngineProfile
from batchserve.models.textstream import TextStream

CONFIG = PolicyConfig(kind="adaptive", max_batch_size=4)


def pending(n: int, **fields: object) -> list[Pending]:
    values: dict[str, object] = {"arrived_at": 0.0, "deadline": float("inf"), "prompt_tokens": 10}
    values.update(max_tokens=20, **fields)
    return [Pending(id=f"r{i}", **values) for i in range(n)]  # type: ignore[arg-type]


def per_token(seconds: float) -> ProfiledSequenceTime:
    prior = ProfiledSequenceTime(FixedBatchTime(1.0))
    prior.set_profile(prefill_tokens_per_s=1e9, decode_step_s=seconds)
    return prior


def test_everything_that_fits_goes_at_once_in_batches_of_the_size_limit() -> None:
    decision = decide_engine(
        pending(10), 0.0, Credit(seqs=7, tokens=10_000), CONFIG, per_token(0.01)
    )
    assert [len(b) for b in decision.batches] == [4, 3]
    assert decision.wake_at is None and decision.expire == ()


def test_nothing_goes_without_room() -> None:
    decision = decide_engine(pending(3), 0.0, Credit(0, 10_000), CONFIG, per_token(0.01))
    assert decision.batches == ()


def test_the_token_budget_lets_smaller_requests_through() -> None:
    big = Pending(id="big", arrived_at=0.0, deadline=1e9, prompt_tokens=500, max_tokens=500)
    small = pending(2)  # 30 tokens each
    decision = decide_engine(
        [big, *small], 0.0, Credit(seqs=4, tokens=100), CONFIG, per_token(0.01)
    )
    assert [p.id for b in decision.batches for p in b] == ["r0", "r1"]


def test_a_retry_group_goes_whole_and_first_or_waits() -> None:
    group = [
        Pending(id=f"g{i}", arrived_at=0.0, deadline=1e9, group="b:0", max_tokens=20)
        for i in range(3)
    ]
    fresh = pending(2)
    roomy = decide_engine([*fresh, *group], 0.0, Credit(5, 10_000), CONFIG, per_token(0.01))
    assert [[p.id for p in b] for b in roomy.batches] == [["g0", "g1", "g2"], ["r0", "r1"]]
    tight = decide_engine([*fresh, *group], 0.0, Credit(2, 10_000), CONFIG, per_token(0.01))
    assert tight.batches == ()  # the group is oldest: nobody overtakes it


def test_a_request_that_cannot_finish_by_its_deadline_is_expired() -> None:
    # 20 tokens at 0.1 s: 2 s alone. Due in 1 s: hopeless even now.
    doomed = Pending(id="late", arrived_at=0.0, deadline=1.0, max_tokens=20)
    fine = Pending(id="fine", arrived_at=0.0, deadline=10.0, max_tokens=20)
    decision = decide_engine([doomed, fine], 0.0, Credit(0, 0), CONFIG, per_token(0.1))
    assert [p.id for p in decision.expire] == ["late"]
    assert decision.wake_at is not None and abs(decision.wake_at - 8.0) < 1e-3


def test_tenants_share_a_dispatch_by_weight() -> None:
    heavy = [Pending(id=f"h{i}", arrived_at=0.0, deadline=1e9, tenant="h") for i in range(8)]
    light = [Pending(id=f"l{i}", arrived_at=1.0, deadline=1e9, tenant="l") for i in range(8)]
    decision = decide_engine(
        heavy + light, 2.0, Credit(4, 10_000), CONFIG, per_token(0.01), Load(weights={"h": 1})
    )
    [batch] = decision.batches
    assert sorted(p.tenant for p in batch) == ["h", "h", "l", "l"]
    assert all(p.lane is Lane.INTERACTIVE for p in batch)


def test_the_ledger_counts_what_is_out_until_it_is_freed() -> None:
    ledger = EngineLedger()
    ledger.resize(Credit(4, 1000))
    first, second = uuid.uuid4(), uuid.uuid4()
    ledger.take(first, {"a": 100, "b": 100})
    ledger.take(second, {"c": 300})
    assert ledger.free() == Credit(1, 500)
    assert ledger.release(first, ["a"]) and ledger.free() == Credit(2, 600)
    assert ledger.close(second) and ledger.free() == Credit(3, 900)
    assert not ledger.release(second, ["c"])  # already gone
    # A request bigger than an engine costs a whole engine, so it can still go to an empty one.
    assert ledger.cost(5000, 5000) == 1000


def test_the_ledger_follows_postgres_except_what_is_newer() -> None:
    ledger = EngineLedger()
    ledger.resize(Credit(8, 1000))
    ours, just_sent, theirs = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    ledger.take(ours, {"a": 10, "b": 10})
    ledger.take(just_sent, {"c": 10})
    freed = ledger.sync({ours: {"a": 10}, theirs: {"d": 50}}, keep={just_sent})
    assert freed  # "b" finished and its event was missed
    assert ledger.batches() == {ours, just_sent, theirs}
    assert ledger.seqs_out == 3 and ledger.tokens_out == 70


def test_the_prior_is_the_engines_measured_speed_and_learning_takes_over() -> None:
    prior = ProfiledSequenceTime(FixedBatchTime(3.0))
    assert prior.batch_s(BatchShape(1, 100, 50)) == 3.0  # no engine has measured yet
    prior.set_profile(prefill_tokens_per_s=1000.0, decode_step_s=0.05)
    assert abs(prior.batch_s(BatchShape(1, 100, 50)) - (0.1 + 2.5)) < 1e-9
    learned = LearnedBatchTime(prior, min_observations=4)
    cost = SequenceCost.of(learned)
    assert cost is not None and abs(cost.seconds(100, 50) - 2.6) < 1e-9
    for prompt, tokens in [(10, 10), (20, 40), (40, 20), (80, 80), (5, 60)]:
        learned.observe(BatchObservation(BatchShape(1, prompt, tokens), 0.5 + 0.02 * tokens))
    cost = SequenceCost.of(learned)
    assert cost is not None and abs(cost.seconds(30, 100) - 2.5) < 1e-6
    assert abs(cost.seconds(30, 100) - learned.batch_s(BatchShape(1, 30, 100))) < 1e-9


def test_a_fit_that_cannot_tell_a_tokens_time_leaves_it_to_the_measured_speed() -> None:
    prior = ProfiledSequenceTime(FixedBatchTime(3.0))
    prior.set_profile(prefill_tokens_per_s=1000.0, decode_step_s=0.05)
    learned = LearnedBatchTime(prior, min_observations=4)
    # Every sequence asked for 32 tokens; the longer prompts took longer (they queued): the
    # least-norm fit puts a negative intercept, and with it a negative time a token.
    for prompt in (200, 400, 600, 800, 900):
        learned.observe(BatchObservation(BatchShape(1, prompt, 32), -1.0 + 0.01 * prompt))
    assert learned.coefficients is not None
    assert learned.coefficients[2] + learned.coefficients[3] < 0
    cost = SequenceCost.of(learned)
    assert cost is not None and cost.per_token_s == 0.05
    assert sequence_time_limit_s(cost.per_token_s * 32) == 61.6


def test_a_sequences_time_limit_grows_with_what_it_asks_for() -> None:
    assert sequence_time_limit_s(1.0) == 61.0
    assert sequence_time_limit_s(100.0) == 400.0  # 500 tokens at 0.2 s: never cut short


def test_an_engine_finish_estimate_counts_the_rounds_ahead() -> None:
    def finish(ahead: int, free: int) -> float | None:
        return estimate_engine_finish(
            now=0.0, ahead=ahead, free_seqs=free, capacity_seqs=4, typical_s=10.0, own_s=2.0
        )

    assert finish(0, 4) == 2.0
    assert finish(3, 4) == 2.0
    assert finish(4, 4) == 12.0  # waits for one engine's worth to finish
    assert finish(9, 1) == 32.0
    assert (
        estimate_engine_finish(
            now=0.0, ahead=0, free_seqs=0, capacity_seqs=0, typical_s=1.0, own_s=1.0
        )
        is None
    )


def test_capacity_and_profile_travel_as_text_and_numbers() -> None:
    capacity = EngineCapacity(32, 45_000)
    assert EngineCapacity.decode(capacity.encode()) == capacity
    profile = EngineProfile(
        prefill_tokens_per_s=1000.0, decode_step_s=0.1, decode_step_s_alone=0.05
    )
    assert profile.tokens_per_s(32) == 320.0
    assert abs(profile.sequence_s(200, 10) - 1.2) < 1e-9


def test_text_is_handed_out_only_once_it_cannot_be_a_stop_string() -> None:
    pieces = iter(["Hello", " wor", "ld", "!", " END", " more"])
    stream = TextStream(lambda _token: next(pieces), stop=(" END",))
    shown = []
    for _ in range(5):
        stream.push(0)
        shown.append(stream.take())
    assert stream.stopped and stream.text == "Hello world!"
    assert "".join(shown) + stream.rest() == "Hello world!"
    assert all("END" not in piece for piece in shown)


def test_a_stop_string_split_across_tokens_is_found() -> None:
    pieces = iter(["a", "b", "<", "/", "s", ">", "c"])
    stream = TextStream(lambda _token: next(pieces), stop=("</s>",))
    for _ in range(7):
        stream.push(0)
    assert stream.stopped and stream.text == "ab"


def test_without_stop_strings_text_goes_out_at_once() -> None:
    pieces = iter(["x", None, "y"])
    stream = TextStream(lambda _token: next(pieces))
    out = []
    for _ in range(3):
        stream.push(0)
        out.append(stream.take())
    assert out == ["x", "", "y"]
