"""``max_tokens`` where the caller gives none: the model's ``max_new_tokens``, bounded by the
context left after the prompt (as OpenAI and vLLM do), on every route that builds a request."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from batchserve.api.openai_schemas import ChatBody
from batchserve.api.schemas import SubmitRequest
from batchserve.api.submission import build_command
from batchserve.core.errors import ContextLengthExceeded
from batchserve.core.settings import Settings
from batchserve.models.registry import ModelSpec, Registry

SPEC = ModelSpec(name="short", backend="fixed", context_length=100, max_new_tokens=80)
REGISTRY = Registry({SPEC.name: SPEC})
SETTINGS = Settings()


def command_of(body: SubmitRequest, prompt_tokens: int | None) -> tuple[int, int]:
    command = build_command(
        body,
        tenant="t",
        idempotency_key=None,
        registry=REGISTRY,
        settings=SETTINGS,
        now=datetime.now(UTC),
        prompt_tokens=prompt_tokens,
    )
    assert command.params["max_tokens"] == command.max_tokens  # what the worker reads
    return command.max_tokens, command.prompt_tokens


def native(**params: object) -> SubmitRequest:
    return SubmitRequest.model_validate({"model": "short", "input": "hello", "params": params})


def test_absent_it_is_the_models_max_new_tokens() -> None:
    assert command_of(native(), prompt_tokens=5) == (80, 5)
    assert command_of(native(max_tokens=None), prompt_tokens=5) == (80, 5)


def test_absent_it_is_bounded_by_the_context_left_after_the_prompt() -> None:
    assert command_of(native(), prompt_tokens=90) == (10, 90)
    assert command_of(native(), prompt_tokens=99) == (1, 99)


def test_a_prompt_that_fills_the_context_is_refused_naming_it() -> None:
    with pytest.raises(ContextLengthExceeded) as refused:
        command_of(native(), prompt_tokens=100)
    assert refused.value.field == "input"
    assert "100 tokens and at least 1 must follow" in str(refused.value)


def test_without_an_exact_count_the_estimate_bounds_it() -> None:
    long_input = "word " * 80  # ~100 tokens by the 4-characters estimate
    body = SubmitRequest.model_validate({"model": "short", "input": long_input})
    max_tokens, estimated = command_of(body, prompt_tokens=None)
    assert max_tokens == max(1, 100 - estimated) < 80


def test_given_it_is_kept_and_checked_as_before() -> None:
    assert command_of(native(max_tokens=7), prompt_tokens=90) == (7, 90)
    with pytest.raises(ContextLengthExceeded):
        command_of(native(max_tokens=20), prompt_tokens=90)


def test_an_openai_body_without_max_tokens_gets_the_default() -> None:
    chat = ChatBody.model_validate(
        {"model": "short", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert command_of(chat.to_submit(), prompt_tokens=12) == (80, 12)
    chat = ChatBody.model_validate(
        {"model": "short", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
    )
    assert command_of(chat.to_submit(), prompt_tokens=12) == (9, 12)
