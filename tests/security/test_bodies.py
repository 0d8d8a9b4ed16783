"""Bodies an outside tester sent: each refused with the right status, naming what was wrong and
the limit, and nothing stored (issue 21, items 4 and 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.security.conftest import stored_requests

SUBMIT = "/v1/requests"
CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


def submit(**fields: Any) -> dict[str, Any]:
    return {"model": "echo-100ms", "input": "hello", **fields}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (submit(params={"max_tokens": True}), "params.max_tokens"),
        (submit(params={"max_tokens": "10"}), "params.max_tokens"),
        (submit(params={"max_tokens": 10.5}), "params.max_tokens"),
        (submit(params={"temperature": "0.5"}), "params.temperature"),
        (submit(params={"seed": False}), "params.seed"),
        (submit(params={"ignore_eos": 1}), "params.ignore_eos"),
        (submit(timeout_s="10"), "timeout_s"),
        (submit(timeout_s=True), "timeout_s"),
    ],
)
async def test_a_string_is_not_a_number_and_a_bool_not_an_int(
    client: httpx.AsyncClient, app: FastAPI, body: dict[str, Any], field: str
) -> None:
    response = await client.post(SUBMIT, json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    assert await stored_requests(app) == 0


async def test_numbers_of_the_right_type_still_pass(client: httpx.AsyncClient) -> None:
    response = await client.post(
        SUBMIT, json=submit(params={"max_tokens": 5, "temperature": 1, "top_p": 0.5}, timeout_s=10)
    )
    assert response.status_code == 202, response.text
    # JSON has one number type and JSON Schema counts 10.0 as an integer: so does the API
    # (schemathesis sends such numbers for integer fields and expects them taken).
    integral = await client.post(SUBMIT, json=submit(params={"max_tokens": 10.0, "seed": 7.0}))
    assert integral.status_code == 202, integral.text
    stored = await client.get(f"/v1/requests/{integral.json()['id']}")
    assert stored.status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", True), ("max_tokens", "10"), ("temperature", "1"), ("stream", "yes")],
)
async def test_the_openai_routes_type_strictly_too(
    client: httpx.AsyncClient, field: str, value: Any
) -> None:
    body = {"model": "echo-100ms", "messages": [{"role": "user", "content": "hi"}], field: value}
    response = await client.post(CHAT, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field


@pytest.mark.parametrize(
    ("raw", "code", "limit"),
    [
        (b'{"model": "echo-100ms", "input": "a", "input": "b"}', "duplicate_key", None),
        (b'{"model": "echo-100ms", "input": "\xff\xfe"}', "invalid_encoding", None),
        (
            b'{"model": "echo-100ms", "input": "a", "timeout_s": ' + b"9" * 5000 + b"}",
            "number_too_long",
            {"max_digits": 4300},
        ),
        (
            b'{"model": "echo-100ms", "metadata": ' + b"[" * 100 + b"]" * 100 + b"}",
            "too_deep",
            {"max_depth": 64},
        ),
        (
            b'{"model": "echo-100ms", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
            "too_deep",
            {"max_depth": 64},
        ),
        (b'{"model": "echo-100ms", "input": ', "malformed_json", None),
    ],
)
async def test_bodies_the_parser_cannot_take_are_refused_by_name(
    client: httpx.AsyncClient, app: FastAPI, raw: bytes, code: str, limit: dict[str, int] | None
) -> None:
    response = await client.post(SUBMIT, content=raw, headers=JSON)
    assert response.status_code == 400, response.text
    problem = response.json()
    assert problem["code"] == code and problem["field"] == "body", problem
    assert problem.get("limit") == limit
    assert await stored_requests(app) == 0
    # The OpenAI routes say the same in OpenAI's shape.
    chat = await client.post(CHAT, content=raw.replace(b'"input"', b'"prompt"'), headers=JSON)
    assert chat.status_code == 400 and chat.json()["error"]["code"] == code, chat.text


async def test_an_oversized_chunked_body_is_413(
    client: httpx.AsyncClient, app: FastAPI, settings: Any
) -> None:
    limit = settings.max_body_bytes

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model": "echo-100ms", "input": "'
        for _ in range(limit // 65_536 + 2):
            yield b"a" * 65_536
        yield b'"}'

    response = await client.post(SUBMIT, content=chunks(), headers=JSON)  # no Content-Length
    assert response.status_code == 413, response.text
    assert response.json()["limit"] == {"max_bytes": limit}
    assert await stored_requests(app) == 0


async def test_an_oversized_chunked_upload_is_413(client: httpx.AsyncClient, settings: Any) -> None:
    limit = settings.max_file_bytes + 65_536

    async def chunks() -> AsyncIterator[bytes]:
        yield b'--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        for _ in range(limit // 1_048_576 + 2):
            yield b"a" * 1_048_576

    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    response = await client.post("/v1/files", content=chunks(), headers=headers)
    assert response.status_code == 413, response.text
