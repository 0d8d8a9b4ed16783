"""A client's retry of a synchronous OpenAI call with the same ``Idempotency-Key`` never runs the
request twice (issue 21, item 7): it gets the first call's answer."""

from __future__ import annotations

import asyncio

import httpx

from batchserve.testing.deployment import Stack
from tests.support.live import db_rows

ECHO = "echo-100ms"


async def test_a_retried_completion_with_the_same_key_runs_once(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({ECHO: 1})
    chat = {"model": ECHO, "messages": [{"role": "user", "content": "only once"}]}
    key = {"Idempotency-Key": "retry-me-1"}
    first, again = await asyncio.gather(
        http.post("/v1/chat/completions", json=chat, headers=key),
        http.post("/v1/chat/completions", json=chat, headers=key),  # a retry racing the first
    )
    later = await http.post("/v1/chat/completions", json=chat, headers=key)
    # A retry while the first is still being admitted is told so (409, as on /v1/requests);
    # whichever won, the other and the later retry get its answer.
    won = next(r for r in (first, again) if r.status_code == 200)
    for racing in (first, again):
        assert racing.status_code == 200 or (
            racing.status_code == 409 and racing.json()["error"]["code"] == "idempotency_key_in_use"
        ), racing.text
        if racing.status_code == 200:
            assert racing.json()["id"] == won.json()["id"]
    assert later.status_code == 200 and later.json()["id"] == won.json()["id"]
    assert later.json()["choices"][0]["message"]["content"] == "only once"
    completion = {"model": ECHO, "prompt": "once too"}
    text = [
        await http.post("/v1/completions", json=completion, headers={"Idempotency-Key": "k2"})
        for _ in range(2)
    ]
    assert text[0].json()["id"] == text[1].json()["id"]
    assert db_rows(stack, "SELECT count(*) FROM requests")[0][0] == 2  # one run each
    # The same key with another body is refused, naming the key; nothing more is stored.
    other = await http.post(
        "/v1/chat/completions",
        json={**chat, "messages": [{"role": "user", "content": "something else"}]},
        headers=key,
    )
    assert other.status_code == 400, other.text
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    assert db_rows(stack, "SELECT count(*) FROM requests")[0][0] == 2
