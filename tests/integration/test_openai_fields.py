"""Every field of an OpenAI request is honoured or refused with a 400 naming it (issue 20,
item 1): none is dropped. Checked on the real API in-process (no worker: what is accepted is
stored with the request, for the worker's engine to honour)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import psycopg

from batchserve.core.settings import Settings

ECHO = "echo-100ms"  # the fixed backend: no sampling, no grammar
SMOL = "smollm2-135m"  # the transformers engine: every field
HI = [{"role": "user", "content": "hi"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}},
    "required": ["name"],
}


def rows(settings: Settings, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    assert settings.database_url
    with psycopg.connect(settings.database_url.replace("+psycopg", "")) as conn:
        return list(conn.execute(sql, params).fetchall())


async def refused(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str | None:
    answer = await client.post(path, json=body)
    assert answer.status_code == 400, (body, answer.text)
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"], error
    param: str | None = error["param"]
    return param


async def test_fields_that_would_be_dropped_are_refused_by_name(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    chat = {"model": SMOL, "messages": HI, "max_tokens": 4}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"bogus_field": 1}, "bogus_field"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"store": True}, "store"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "messages[0].name"),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}]},
            "messages[0].tool_calls",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        (
            {"response_format": {"type": "json_object", "json_schema": {"name": "p"}}},
            "response_format",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"type": "object", "oneOf": 7}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
        ({"logit_bias": {"5": 200}}, "logit_bias"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"top_k": -1}, "top_k"),
        ({"min_tokens": 8}, "min_tokens"),  # more than max_tokens (4)
    ]
    for extra, param in cases:
        body = {**chat, **extra}
        assert await refused(client, "/v1/chat/completions", body) == param, extra
    # A backend that cannot honour a field refuses it, naming it.
    for extra in (
        {"response_format": {"type": "json_object"}},
        {"top_k": 5},
        {"frequency_penalty": 0.5},
        {"logit_bias": {"5": 1}},
    ):
        body = {"model": ECHO, "messages": HI, **extra}
        assert await refused(client, "/v1/chat/completions", body) == next(iter(extra))
        native = await client.post(
            "/v1/requests", json={"model": ECHO, "input": "hi", "params": extra}
        )
        assert native.status_code == 422, native.text  # the native routes: problem+json
        assert native.json()["errors"][0]["field"] == f"params.{next(iter(extra))}"
    # Nothing refused was stored.
    assert rows(settings, "SELECT count(*) FROM requests") == [(0,)]


async def test_what_is_taken_is_stored_for_the_engine(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    fields = {
        "top_k": 20,
        "min_p": 0.05,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.25,
        "repetition_penalty": 1.1,
        "logit_bias": {"42": -5},
        "min_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
    }
    inert = {
        "store": False,
        "service_tier": "auto",
        "tool_choice": "none",
        "parallel_tool_calls": True,
        "modalities": ["text"],
        "top_logprobs": 0,
        "prompt_cache_key": "k",
        "verbosity": None,
        "n": 1,
        "user": "u7",
    }
    body = {"model": SMOL, "input": "hi", "params": {"max_tokens": 8, **fields}}
    native = await client.post("/v1/requests", json=body)
    assert native.status_code == 202, native.text
    # The OpenAI route takes the same fields, and the inert ones at their inert values. It
    # waits for an answer no worker gives here: the call is dropped once its row is stored.
    openai = {"model": SMOL, "messages": HI, "max_tokens": 8, **fields, **inert}
    call = asyncio.create_task(client.post("/v1/chat/completions", json=openai))
    query = "SELECT count(*) FROM requests WHERE model = %s"
    for _ in range(200):
        if rows(settings, query, SMOL) == [(2,)] or call.done():
            break
        await asyncio.sleep(0.02)
    assert not call.done(), call.result().text
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    stored = rows(
        settings, "SELECT params, metadata FROM requests WHERE model = %s ORDER BY id", SMOL
    )
    assert len(stored) == 2
    for params, _ in stored:
        kept = {name: params.get(name) for name in fields}
        assert kept == {**fields, "logit_bias": {"42": -5.0}}
    assert stored[1][1] == {"user": "u7"}
