"""The transformers engine on the real SmolLM2-135M: continuous batching must not change answers.

The model is converted once per machine into the default cache (about a minute the first time),
then loaded once for this module (float32, so that answers are exactly the same however the
sequences share the engine). The engine is stepped directly, as its thread would: no sleeps.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from batchserve.models.engine import SequenceRequest, SequenceUpdate
from batchserve.models.hf import ensure_converted
from batchserve.models.registry import ModelSpec, load_registry
from batchserve.models.scheduling import prefill_chunks
from batchserve.models.transformers_engine import TransformersEngine

QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three colours.",
    "Explain in one sentence why the sky looks blue during the day.",
    "Write a haiku about autumn leaves falling gently onto a quiet pond in the early morning.",
    "I have a small garden with tomatoes, basil and peppers. The leaves of the tomatoes are "
    "turning yellow from the bottom up, and some have brown spots. What could be wrong?",
    "List the planets of the solar system in order from the Sun, and for each one give a "
    "short fact that a ten-year-old would find interesting, such as its size or its moons.",
    "Summarise this: The committee met on Tuesday to discuss the budget for next year. After a "
    "long debate about the costs of the new library wing, the repairs to the swimming pool and "
    "the salaries of the part-time staff, they agreed to postpone the decision until the next "
    "meeting, when the final figures from the treasurer will be available to every member.",
]


def chat(question: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}]


def req(
    request_id: str,
    *,
    messages: list[dict[str, Any]] | None = None,
    text: str | None = None,
    max_tokens: int = 16,
    **settings: Any,
) -> SequenceRequest:
    settings.setdefault("temperature", 0.0)
    return SequenceRequest(request_id, text, messages, max_tokens, **settings)


@dataclass
class Outcome:
    text: str = ""
    pieces: list[str] = field(default_factory=list)
    last: SequenceUpdate | None = None
    finished_at_step: int = -1


def run(
    engine: TransformersEngine, requests: Iterable[SequenceRequest], **at_step: Any
) -> dict[str, Outcome]:
    """Add ``requests`` and step until each has finished; ``at_step={n: callable}`` runs a
    callable before step n (to add or abort mid-run)."""
    outcomes: dict[str, Outcome] = {}
    for request in requests:
        engine.add(request)
        outcomes[request.request_id] = Outcome()
    steps = 0
    with torch.inference_mode():
        while any(o.last is None or not o.last.finished for o in outcomes.values()):
            hook = at_step.get(f"step_{steps}")
            if hook is not None:
                for added in hook() or ():
                    outcomes[added.request_id] = Outcome()
            for update in engine.step():
                outcome = outcomes[update.request_id]
                outcome.text += update.text
                outcome.pieces.append(update.text)
                outcome.last = update
                if update.finished:
                    outcome.finished_at_step = steps
            steps += 1
            assert steps < 5000, "the engine did not finish"
    return outcomes


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    found = load_registry(None).get("smollm2-135m")
    assert found is not None
    options = {**found.options, "dtype": "float32", "max_num_seqs": 8, "max_prefill_tokens": 96}
    return ModelSpec(name=found.name, backend=found.backend, options=options)


@pytest.fixture(scope="module")
def engine(spec: ModelSpec) -> TransformersEngine:
    return TransformersEngine(spec)


def test_sequences_sharing_the_engine_answer_as_if_alone(engine: TransformersEngine) -> None:
    batch = [req(f"q{i}", messages=chat(q), max_tokens=20) for i, q in enumerate(QUESTIONS)]
    lengths = [engine.count_tokens(None, chat(q)) for q in QUESTIONS]
    assert max(lengths) > 2 * engine.max_prefill_tokens // 2  # prompts of several chunks

    shared_before = engine.shared_prefix_tokens
    together = run(engine, batch)
    # They share the chat template's opening: computed once, copied to the others.
    assert engine.shared_prefix_tokens - shared_before >= (len(batch) - 1) * 16
    alone = {r.request_id: run(engine, [r])[r.request_id] for r in batch}

    for request_id, outcome in together.items():
        single = alone[request_id]
        assert outcome.text == single.text
        assert outcome.last is not None and single.last is not None
        assert outcome.last.completion_tokens == single.last.completion_tokens


def test_a_sequence_joining_mid_generation_gets_the_same_answer(
    engine: TransformersEngine,
) -> None:
    long = req("long", messages=chat(QUESTIONS[6]), max_tokens=40)
    late = req("late", messages=chat(QUESTIONS[3]), max_tokens=12)
    alone = run(engine, [late])["late"]

    def join_late() -> list[SequenceRequest]:
        engine.add(late)
        return [late]

    # The late one joins at a step boundary while the long one is generating.
    outcomes = run(engine, [long], step_10=join_late)

    assert outcomes["late"].text == alone.text
    # ... and leaves as soon as it is done, long before its elder.
    assert outcomes["late"].finished_at_step < outcomes["long"].finished_at_step


def test_a_long_shared_system_prompt_is_computed_once(engine: TransformersEngine) -> None:
    system = {"role": "system", "content": QUESTIONS[7] + " Answer as a helpful librarian."}
    first = req("first", messages=[system, *chat(QUESTIONS[1])], max_tokens=12)
    second = req("second", messages=[system, *chat(QUESTIONS[2])], max_tokens=12)
    alone = {r.request_id: run(engine, [r])[r.request_id].text for r in (first, second)}

    before = engine.shared_prefix_tokens
    outcomes = run(engine, [first, second])

    prefix = engine.count_tokens(None, [system])
    assert engine.shared_prefix_tokens - before >= prefix - 8  # the system prompt, copied
    assert {k: o.text for k, o in outcomes.items()} == alone


def test_the_decode_loop_matches_transformers_generate(engine: TransformersEngine) -> None:
    messages = chat(QUESTIONS[3])
    ids = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False, return_tensors="pt"
    )
    with torch.inference_mode():
        reference = engine.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20
        )
    new_ids = reference[0, ids.shape[1] :].tolist()

    outcome = run(engine, [req("g", messages=messages, max_tokens=20)])["g"]

    assert outcome.last is not None and outcome.last.completion_tokens == len(new_ids)
    assert outcome.text == engine.tokenizer.decode(new_ids, skip_special_tokens=True)


def test_each_sequence_keeps_its_own_max_tokens_and_stop(engine: TransformersEngine) -> None:
    story = chat("Tell me a story about a dragon who learns to bake bread.")
    unstopped = run(engine, [req("free", messages=story, max_tokens=24)])["free"].text
    words = unstopped.split()
    assert len(words) >= 6, unstopped
    stop = f" {words[4]}"  # a word well inside the answer, so the cut is visible
    cut_at = unstopped.index(stop)

    outcomes = run(
        engine,
        [
            req("short", messages=chat(QUESTIONS[6]), max_tokens=3),
            req("stopped", messages=story, max_tokens=24, stop=(stop, "never-appears")),
            req("long", messages=story, max_tokens=24),
        ],
    )

    short, stopped, long = (outcomes[k] for k in ("short", "stopped", "long"))
    assert short.last is not None and stopped.last is not None and long.last is not None
    assert (short.last.completion_tokens, short.last.finish_reason) == (3, "length")
    assert stopped.text == unstopped[:cut_at] and stopped.last.finish_reason == "stop"
    assert 0 < stopped.last.completion_tokens < long.last.completion_tokens
    assert long.text == unstopped
    # The text arrives in pieces as it is made, and no piece ever shows a part of the stop.
    assert len([p for p in stopped.pieces if p]) > 1
    assert all(stop.strip() not in piece for piece in stopped.pieces)


def test_usage_counts_match_the_tokenizer(engine: TransformersEngine) -> None:
    messages = chat(QUESTIONS[1])
    text = "The three primary colours are"
    tokenizer = engine.tokenizer

    outcomes = run(
        engine,
        [req("chat", messages=messages, max_tokens=12), req("text", text=text, max_tokens=12)],
    )

    template_ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )
    chat_last, text_last = outcomes["chat"].last, outcomes["text"].last
    assert chat_last is not None and text_last is not None
    assert chat_last.prompt_tokens == len(template_ids) == engine.count_tokens(None, messages)
    assert text_last.prompt_tokens == len(tokenizer(text).input_ids)
    for outcome in outcomes.values():
        assert outcome.last is not None
        assert 0 < outcome.last.completion_tokens <= 12
        # Without a stop string every generated id but the end-of-sequence one is in the text.
        shown = len(tokenizer(outcome.text, add_special_tokens=False).input_ids)
        assert outcome.last.completion_tokens - shown in (0, 1)


def test_ignore_eos_generates_every_token_asked_for(engine: TransformersEngine) -> None:
    plain = run(engine, [req("plain", messages=chat(QUESTIONS[0]), max_tokens=40)])["plain"]
    assert plain.last is not None and plain.last.finish_reason == "stop"  # a short greeting
    forced = run(
        engine, [req("forced", messages=chat(QUESTIONS[0]), max_tokens=40, ignore_eos=True)]
    )["forced"]
    assert forced.last is not None
    assert (forced.last.completion_tokens, forced.last.finish_reason) == (40, "length")


def test_a_prompt_longer_than_the_context_fails_alone(engine: TransformersEngine) -> None:
    too_long = "word " * (engine.context_length + 100)

    outcomes = run(
        engine,
        [
            req("before", messages=chat(QUESTIONS[0]), max_tokens=8),
            req("huge", text=too_long, max_tokens=8),
            req("after", messages=chat(QUESTIONS[1]), max_tokens=8),
        ],
    )

    huge = outcomes["huge"].last
    assert huge is not None and huge.error_code == "context_length_exceeded"
    assert huge.error_message and "max_tokens" in huge.error_message
    assert outcomes["before"].text and outcomes["after"].text


def test_seeded_sampling_is_reproducible(engine: TransformersEngine) -> None:
    sampled = req("s", messages=chat(QUESTIONS[4]), temperature=0.8, seed=1234, max_tokens=24)
    greedy = req("g", messages=chat(QUESTIONS[4]), max_tokens=24)

    first = run(engine, [sampled, greedy])
    second = run(engine, [sampled, greedy])

    assert first["s"].text and first["s"].text == second["s"].text
    assert first["g"].text == second["g"].text


def test_a_tiny_top_p_keeps_only_the_likeliest_token(engine: TransformersEngine) -> None:
    messages = chat(QUESTIONS[2])
    outcomes = run(
        engine,
        [
            req("nucleus", messages=messages, temperature=1.0, top_p=1e-6, max_tokens=16),
            req("greedy", messages=messages, max_tokens=16),
        ],
    )
    assert outcomes["nucleus"].text == outcomes["greedy"].text


def test_an_aborted_sequence_leaves_at_the_next_step(engine: TransformersEngine) -> None:
    story = chat(QUESTIONS[5])
    outcomes = run(
        engine,
        [
            req("cancel-me", messages=story, max_tokens=60),
            req("keep", messages=story, max_tokens=60),
        ],
        step_6=lambda: engine.abort("cancel-me"),
    )

    cancelled, kept = outcomes["cancel-me"], outcomes["keep"]
    assert cancelled.last is not None and kept.last is not None
    assert cancelled.last.finish_reason == "cancelled"
    assert cancelled.finished_at_step == 6  # the very step after the abort
    assert cancelled.last.completion_tokens < kept.last.completion_tokens
    assert engine.health().running == 0  # its row is free again


def test_work_arriving_at_an_idle_engine_does_not_find_it_stalled(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's watchdog reads the time since the last step while sequences run: an engine
    idle for longer than the stall limit must not look hung the moment a request arrives (its
    first step, a prefill, may take a second; the watchdog may look before it ends)."""
    assert engine.health().running == 0 and engine.health().waiting == 0
    last_step = engine.health().last_step_at
    monkeypatch.setattr(engine, "_clock", lambda: last_step + 600.0)  # ten minutes idle
    engine.add(req("after-a-pause", messages=chat(QUESTIONS[0]), max_tokens=2))
    health = engine.health()
    assert health.waiting == 1
    assert health.last_step_at == last_step + 600.0  # not 600 s since its last step
    with torch.inference_mode():
        while engine.health().waiting or engine.health().running:
            engine.step()


def test_admission_waits_for_room_in_the_kv_budget(spec: ModelSpec) -> None:
    small = ModelSpec(
        name=spec.name,
        backend=spec.backend,
        options={**spec.options, "kv_cache_gb": 0.0044},  # ~100 tokens of float32 KV
    )
    tight = TransformersEngine(small)
    assert 64 <= tight.kv_budget_tokens < 128
    # 5 prompt tokens and 60 to generate: one fits the budget, two do not.
    first = req("first", text="Count: one two three", max_tokens=60, ignore_eos=True)
    second = req("second", text="Count: four five six", max_tokens=60, ignore_eos=True)

    outcomes = run(tight, [first, second])

    # The second waited for the first to leave: it finished a whole generation later.
    assert outcomes["second"].finished_at_step >= outcomes["first"].finished_at_step + 59
    assert outcomes["first"].text and outcomes["second"].text


def test_the_engine_measures_its_speed(engine: TransformersEngine) -> None:
    profile = engine.measure()
    assert profile.prefill_tokens_per_s > 0
    assert 0 < profile.decode_step_s_alone <= profile.decode_step_s * 2
    assert profile.tokens_per_s(engine.max_num_seqs) > 1 / profile.decode_step_s_alone
    assert engine.health().running == 0  # the synthetic sequences are gone


def test_prefill_chunks_fill_the_budget_oldest_first() -> None:
    assert prefill_chunks([300], 96) == [96]
    assert prefill_chunks([40, 40, 40], 96) == [40, 40, 16]  # packed: the whole budget
    assert prefill_chunks([20, 500, 500], 96) == [20, 76]  # the oldest first, no padding
    assert prefill_chunks([10, 10, 10, 10, 200], 96) == [10, 10, 10, 10, 56]
    assert prefill_chunks([200, 10], 96) == [96]


def test_a_burst_is_admitted_with_one_resize_and_packed_prefill(
    engine: TransformersEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admitting a burst grows the cache once (each resize copies all of it), and its prompts
    share forwards of ``max_prefill_tokens`` tokens whatever their lengths: no padding."""
    cache = engine.cache
    with torch.inference_mode():
        engine.step()  # idle: the cache shrinks to its smallest
    growths: list[tuple[int, int]] = []
    resize = cache.resize

    def counted_resize(rows: int, columns: int) -> None:
        if rows > cache.rows or columns > cache.columns:
            growths.append((rows, columns))
        resize(rows, columns)

    widths: list[int] = []
    forward = engine.model.forward

    def counted_forward(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("row_segments") is not None:
            widths.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    monkeypatch.setattr(cache, "resize", counted_resize)
    monkeypatch.setattr(engine.model, "forward", counted_forward)
    # Longer and longer prompts: admitted one at a time, each would widen the cache again.
    burst = [req(f"b{i}", messages=chat(q), max_tokens=4) for i, q in enumerate(QUESTIONS)]
    run(engine, burst)

    assert len(growths) == 1
    prompt_tokens = sum(engine.count_tokens(None, chat(q)) for q in QUESTIONS)
    # The first forward is the first prompt alone (the others wait to copy its chat template),
    # the last is what is left; every one between is full.
    assert len(widths) >= 3
    assert all(width == engine.max_prefill_tokens for width in widths[1:-1])
    assert sum(widths) <= prompt_tokens - (len(QUESTIONS) - 1) * 16


def test_a_second_load_reads_the_converted_cache(
    spec: ModelSpec, engine: TransformersEngine
) -> None:
    cached = ensure_converted(spec)
    weights = cached / "model.safetensors"
    assert weights.is_file() and (cached / "config.json").is_file()
    written_at = weights.stat().st_mtime_ns

    started = time.perf_counter()
    again = TransformersEngine(spec)
    load_s = time.perf_counter() - started

    assert weights.stat().st_mtime_ns == written_at  # loaded, not converted again
    assert load_s < 30.0
    one = req("same", messages=chat(QUESTIONS[1]), max_tokens=8)
    assert run(again, [one])["same"].text == run(engine, [one])["same"].text
