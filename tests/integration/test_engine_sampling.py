"""The transformers engine honours every generation field the API takes, on the real SmolLM2:
a format's grammar (any JSON object, JSON of a schema), penalties, logit bias, a minimum
length, top-k and min-p. Each request keeps its own processing beside plain ones in the same
steps."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from batchserve.models.engine import SequenceRequest
from batchserve.models.registry import ModelSpec
from batchserve.models.sampling import Shaping, allow_only, sample_token, shape_logits
from batchserve.models.transformers_engine import TransformersEngine
from tests.integration.test_transformers_engine import QUESTIONS, chat, req, run
from tests.integration.test_transformers_engine import spec as spec

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def engine(spec: ModelSpec) -> TransformersEngine:
    return TransformersEngine(spec)


def schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}


def test_a_schema_constrains_the_answer_beside_plain_sequences(engine: TransformersEngine) -> None:
    question = chat("Give me a person's name and age.")
    outcomes = run(
        engine,
        [
            req("schema", messages=question, max_tokens=48, response_format=schema_format(PERSON)),
            req(
                "object", messages=question, max_tokens=48, response_format={"type": "json_object"}
            ),
            req(
                "sampled",
                messages=question,
                max_tokens=48,
                temperature=0.9,
                seed=3,
                response_format=schema_format(PERSON),
            ),
            req("plain", messages=question, max_tokens=48),
        ],
    )
    person = json.loads(outcomes["schema"].text)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    assert isinstance(json.loads(outcomes["object"].text), dict)
    sampled = json.loads(outcomes["sampled"].text)
    assert set(sampled) == {"name", "age"} and isinstance(sampled["age"], int)
    for name in ("schema", "object", "sampled"):
        last = outcomes[name].last
        assert last is not None and last.finish_reason == "stop", name  # the JSON is complete
    alone = run(engine, [req("plain", messages=question, max_tokens=48)])
    assert outcomes["plain"].text == alone["plain"].text  # a neighbour's grammar changed nothing


def test_a_format_the_grammar_cannot_take_fails_only_its_own_request(
    engine: TransformersEngine,
) -> None:
    bad = schema_format({"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}})
    outcomes = run(
        engine,
        [
            req("bad", messages=chat(QUESTIONS[0]), response_format=bad),
            req("fine", messages=chat(QUESTIONS[0])),
        ],
    )
    bad_last, fine_last = outcomes["bad"].last, outcomes["fine"].last
    assert bad_last is not None and bad_last.error_code == "model_error"
    assert "response_format" in (bad_last.error_message or "")
    assert fine_last is not None and fine_last.finish_reason in ("stop", "length")


def test_logit_bias_and_min_tokens_and_penalties_change_the_answer(
    engine: TransformersEngine,
) -> None:
    messages = chat(QUESTIONS[1])
    plain = run(engine, [req("p", messages=messages, max_tokens=12)])["p"]
    first = engine.tokenizer(plain.text, add_special_tokens=False).input_ids[0]
    # A strong negative bias on the greedy answer's first token: another token comes first.
    biased = run(
        engine, [req("b", messages=messages, max_tokens=12, logit_bias=((first, -100.0),))]
    )["b"]
    assert engine.tokenizer(biased.text, add_special_tokens=False).input_ids[0] != first
    # "Hi!" ends quickly; with min_tokens it runs on to at least that many tokens.
    short = run(engine, [req("s", messages=chat(QUESTIONS[0]), max_tokens=64)])["s"]
    assert short.last is not None and short.last.finish_reason == "stop"
    floor = short.last.completion_tokens + 10
    longer = run(engine, [req("l", messages=chat(QUESTIONS[0]), max_tokens=64, min_tokens=floor)])[
        "l"
    ]
    assert longer.last is not None and longer.last.completion_tokens >= floor
    # A story at full frequency penalty repeats its tokens less than the greedy one.
    story = chat(QUESTIONS[5])
    outcomes = run(
        engine,
        [
            req("greedy", messages=story, max_tokens=64),
            req("penalised", messages=story, max_tokens=64, frequency_penalty=2.0),
            req("repetition", messages=story, max_tokens=64, repetition_penalty=1.8),
        ],
    )

    def repeats(text: str) -> int:
        ids = engine.tokenizer(text, add_special_tokens=False).input_ids
        return len(ids) - len(set(ids))

    assert repeats(outcomes["penalised"].text) < repeats(outcomes["greedy"].text)
    assert outcomes["repetition"].text != outcomes["greedy"].text


def test_top_k_of_one_is_greedy_and_a_logit_bias_past_the_vocabulary_fails_alone(
    engine: TransformersEngine,
) -> None:
    messages = chat(QUESTIONS[2])
    outcomes = run(
        engine,
        [
            req("k1", messages=messages, temperature=1.5, top_k=1, seed=9, max_tokens=16),
            req("greedy", messages=messages, max_tokens=16),
            req("minp", messages=messages, temperature=1.5, min_p=0.999, seed=9, max_tokens=16),
            req("beyond", messages=messages, logit_bias=((10**8, 5.0),)),
        ],
    )
    assert outcomes["k1"].text == outcomes["greedy"].text == outcomes["minp"].text
    beyond = outcomes["beyond"].last
    assert beyond is not None and beyond.error_code == "model_error"
    assert "logit_bias" in (beyond.error_message or "")


def test_the_processing_itself() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 1.0])
    shaped = shape_logits(
        logits.clone(),
        Shaping(presence_penalty=0.5, frequency_penalty=0.25, logit_bias=((4, 10.0),)),
        prompt_ids=[],
        generated=[3, 3, 2],
        eos_ids={0},
    )
    assert shaped.tolist() == [2.0, -1.0, 0.5 - 0.75, 3.0 - 1.0, 11.0]
    repeated = shape_logits(
        logits.clone(), Shaping(repetition_penalty=2.0), [0, 1], [], eos_ids=set()
    )
    assert repeated.tolist() == [1.0, -2.0, 0.5, 3.0, 1.0]
    floor = shape_logits(logits.clone(), Shaping(min_tokens=2), [], [7], eos_ids={3})
    assert floor[3] == float("-inf") and floor[0] == 2.0
    # A mask allowing tokens 1 and 3 (bits of a 32-bit little-endian word).
    masked = allow_only(logits.clone(), (0b1010).to_bytes(4, "little"))
    assert masked.argmax() == 3 and masked[0] == masked[2] == masked[4] == float("-inf")
    generator = torch.Generator().manual_seed(0)
    draws = {int(sample_token(logits, 2.0, 1.0, generator, top_k=2)) for _ in range(200)}
    assert draws == {0, 3}
    draws = {int(sample_token(logits, 2.0, 1.0, generator, min_p=0.5)) for _ in range(200)}
    assert draws <= {0, 3} and 3 in draws


def test_a_request_keeps_every_field_it_was_given() -> None:
    from batchserve.core.domain import BatchItem

    params = {
        "max_tokens": 8,
        "top_k": 5,
        "min_p": 0.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.2,
        "logit_bias": {"42": -3.0, "7": 2.0},
        "min_tokens": 3,
        "response_format": {"type": "json_object"},
    }
    item = BatchItem("r", "hi", None, params, created_at=0.0, received_at=0.0)
    request = SequenceRequest.of(item, 512)
    assert (request.top_k, request.min_p, request.min_tokens) == (5, 0.1, 3)
    assert (request.presence_penalty, request.frequency_penalty) == (0.5, -0.5)
    assert request.repetition_penalty == 1.2
    assert request.logit_bias == ((7, 2.0), (42, -3.0))
    assert request.response_format == {"type": "json_object"}
