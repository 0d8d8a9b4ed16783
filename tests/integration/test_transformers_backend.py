"""The transformers backend on the real SmolLM2-135M model: batching must not change answers.

The model is converted once per machine into the default cache (about a minute the first time),
then loaded once for this module.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from core.domain import BatchItem, ItemResult
from models.registry import ModelSpec, load_registry
from models.transformers_backend import TransformersBackend, ensure_converted

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


def item(
    request_id: str,
    *,
    messages: list[dict[str, Any]] | None = None,
    text: str | None = None,
    **params: Any,
) -> BatchItem:
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 16)
    return BatchItem(request_id, text, messages, params, created_at=0.0, received_at=0.0)


def texts(results: list[ItemResult]) -> list[str | None]:
    return [r.output for r in results]


@pytest.fixture(scope="module")
def spec() -> ModelSpec:
    found = load_registry(None).get("smollm2-135m")
    assert found is not None
    return found


@pytest.fixture(scope="module")
def backend(spec: ModelSpec) -> TransformersBackend:
    return TransformersBackend(spec)


def test_greedy_answers_are_non_empty_and_repeatable(backend: TransformersBackend) -> None:
    batch = [item(f"r{i}", messages=chat(q)) for i, q in enumerate(QUESTIONS[:3])]

    first = backend.run(batch)
    second = backend.run(batch)

    assert [r.request_id for r in first] == ["r0", "r1", "r2"]
    assert all(r.ok and r.output and r.output.strip() for r in first)
    assert all(r.finish_reason in ("stop", "length") for r in first)
    assert texts(first) == texts(second)


def test_batched_prompts_of_mixed_lengths_answer_as_if_alone(
    backend: TransformersBackend,
) -> None:
    batch = [item(f"q{i}", messages=chat(q)) for i, q in enumerate(QUESTIONS)]
    prompt_lens = [backend.count_tokens(None, chat(q)) for q in QUESTIONS]
    assert max(prompt_lens) - min(prompt_lens) > 60  # the batch really is padded

    together = backend.run(batch)
    assert backend.last_batch_stats["padded_prompt_len"] == max(prompt_lens)
    alone = [backend.run([one])[0] for one in batch]

    assert texts(together) == texts(alone)
    assert [r.completion_tokens for r in together] == [r.completion_tokens for r in alone]


def test_decode_loop_matches_transformers_generate(backend: TransformersBackend) -> None:
    messages = chat(QUESTIONS[3])
    ids = backend.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False, return_tensors="pt"
    )
    with torch.inference_mode():
        reference = backend.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=20
        )
    new_ids = reference[0, ids.shape[1] :].tolist()

    [result] = backend.run([item("g", messages=messages, max_tokens=20)])

    assert result.completion_tokens == len(new_ids)
    assert result.output == backend.tokenizer.decode(new_ids, skip_special_tokens=True)


def test_each_row_keeps_its_own_max_tokens_and_stop(backend: TransformersBackend) -> None:
    story = chat("Tell me a story about a dragon who learns to bake bread.")
    [unstopped] = backend.run([item("free", messages=story, max_tokens=24)])
    assert unstopped.output is not None
    words = unstopped.output.split()
    assert len(words) >= 6, unstopped.output
    stop = f" {words[4]}"  # a word well inside the answer, so the cut is visible
    cut_at = unstopped.output.index(stop)

    short, stopped, long = backend.run(
        [
            item("short", messages=chat(QUESTIONS[6]), max_tokens=3),
            item("stopped", messages=story, max_tokens=24, stop=[stop, "never-appears"]),
            item("long", messages=story, max_tokens=24),
        ]
    )

    assert (short.completion_tokens, short.finish_reason) == (3, "length")
    assert stopped.output == unstopped.output[:cut_at]
    assert stopped.finish_reason == "stop"
    assert 0 < stopped.completion_tokens < unstopped.completion_tokens
    assert long.output == unstopped.output
    assert long.completion_tokens == unstopped.completion_tokens > 3
    assert backend.last_batch_stats["steps"] == long.completion_tokens


def test_usage_counts_match_the_tokenizer(backend: TransformersBackend) -> None:
    messages = chat(QUESTIONS[1])
    text = "The three primary colours are"
    tokenizer = backend.tokenizer

    chat_result, text_result = backend.run(
        [item("chat", messages=messages, max_tokens=12), item("text", text=text, max_tokens=12)]
    )

    template_ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_dict=False
    )
    assert chat_result.prompt_tokens == len(template_ids) == backend.count_tokens(None, messages)
    assert text_result.prompt_tokens == len(tokenizer(text).input_ids)
    for result in (chat_result, text_result):
        assert result.output is not None
        assert 0 < result.completion_tokens <= 12
        if result.finish_reason == "length":
            assert result.completion_tokens == 12
        # Without a stop string every generated id but the end-of-sequence one is in the text.
        shown = len(tokenizer(result.output, add_special_tokens=False).input_ids)
        assert result.completion_tokens - shown in (0, 1)
    stats = backend.last_batch_stats
    assert stats["prompt_tokens"] == chat_result.prompt_tokens + text_result.prompt_tokens
    assert (
        stats["generated_tokens"] == chat_result.completion_tokens + text_result.completion_tokens
    )
    assert stats["size"] == 2 and stats["max_new_tokens"] == 12


def test_a_prompt_longer_than_the_context_fails_alone(backend: TransformersBackend) -> None:
    too_long = "word " * (backend.context_length + 100)

    before, failed, after = backend.run(
        [
            item("before", messages=chat(QUESTIONS[0]), max_tokens=8),
            item("huge", text=too_long, max_tokens=8),
            item("after", messages=chat(QUESTIONS[1]), max_tokens=8),
        ]
    )

    assert failed.error_code == "context_length_exceeded"
    assert failed.output is None and failed.error_message
    assert before.ok and before.output and after.ok and after.output
    assert backend.last_batch_stats["size"] == 2


def test_seeded_sampling_is_reproducible(backend: TransformersBackend) -> None:
    sampled = item("s", messages=chat(QUESTIONS[4]), temperature=0.8, seed=1234, max_tokens=24)
    greedy = item("g", messages=chat(QUESTIONS[4]), max_tokens=24)

    first = backend.run([sampled, greedy])
    second = backend.run([sampled, greedy])

    assert first[0].output and first[0].output == second[0].output
    assert first[1].output == second[1].output


def test_a_tiny_top_p_keeps_only_the_likeliest_token(backend: TransformersBackend) -> None:
    messages = chat(QUESTIONS[2])

    nucleus, greedy = backend.run(
        [
            item("nucleus", messages=messages, temperature=1.0, top_p=1e-6, max_tokens=16),
            item("greedy", messages=messages, max_tokens=16),
        ]
    )

    assert nucleus.output == greedy.output


def test_a_cancelled_row_stops_while_the_others_finish(backend: TransformersBackend) -> None:
    steps: list[str] = []

    def should_stop(request_id: str) -> bool:
        steps.append(request_id)
        return request_id == "cancel-me" and steps.count(request_id) >= 2

    backend.should_stop = should_stop
    try:
        cancelled, kept = backend.run(
            [
                item("cancel-me", messages=chat(QUESTIONS[5]), max_tokens=16),
                item("keep", messages=chat(QUESTIONS[5]), max_tokens=16),
            ]
        )
    finally:
        backend.should_stop = None

    assert cancelled.finish_reason == "cancelled"
    assert cancelled.completion_tokens == 2
    assert kept.finish_reason in ("stop", "length") and kept.completion_tokens > 2


def test_a_second_load_reads_the_converted_cache(
    spec: ModelSpec, backend: TransformersBackend
) -> None:
    cached = ensure_converted(spec)
    weights = cached / "model.safetensors"
    assert weights.is_file() and (cached / "config.json").is_file()
    written_at = weights.stat().st_mtime_ns

    started = time.perf_counter()
    again = TransformersBackend(spec)
    load_s = time.perf_counter() - started

    assert weights.stat().st_mtime_ns == written_at  # loaded, not converted again
    assert load_s < 30.0
    one = item("same", messages=chat(QUESTIONS[1]), max_tokens=8)
    assert texts(again.run([one])) == texts(backend.run([one]))
