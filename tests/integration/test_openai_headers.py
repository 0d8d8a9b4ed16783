"""Headers OpenAI's clients read (issue 20, item 3): ``x-request-id`` on every answer, and
``x-should-retry: false`` where a retry cannot change the answer."""

from __future__ import annotations

import re

import httpx

from batchserve.api.openai_errors import error_response
from batchserve.core.errors import Overloaded, RequestFailed

REQUEST_ID = re.compile(r"^req_[0-9a-f]{32}$")


async def test_every_answer_carries_its_own_request_id(client: httpx.AsyncClient) -> None:
    answers = [
        await client.get("/healthz"),
        await client.get("/v1/models"),
        await client.get("/v1/requests/00000000-0000-7000-8000-000000000000"),  # 404
        await client.post("/v1/requests", json={"model": "echo-100ms"}),  # 422
        await client.post("/v1/chat/completions", json={"model": "echo-100ms", "n": 2}),  # 400
        await client.put("/v1/batches"),  # 405
        await client.get("/v1/models", headers={"Authorization": "Bearer nope"}),  # 401
    ]
    ids = [a.headers.get("x-request-id", "") for a in answers]
    assert all(REQUEST_ID.match(i) for i in ids), ids
    assert len(set(ids)) == len(ids)


def test_a_request_that_ended_says_not_to_retry() -> None:
    for state, code in [("failed", "model_error"), ("expired", None), ("cancelled", None)]:
        answer = error_response(RequestFailed("it ended", error_code=code, state=state))
        assert answer.headers["x-should-retry"] == "false", state
    # Overload is worth retrying (after Retry-After): no such header.
    busy = error_response(Overloaded("busy", retry_after_s=2.0))
    assert "x-should-retry" not in busy.headers and busy.headers["retry-after"] == "2"


async def test_paths_an_openai_client_calls_answer_404_and_405_in_openai_shape(
    client: httpx.AsyncClient,
) -> None:
    for method, path, status in [
        ("POST", "/v1/responses", 404),  # not served: the SDK shows the message
        ("POST", "/v1/moderations", 404),
        ("GET", "/v1/embeddings", 405),
        ("GET", "/v1/chat/completions", 405),
        ("PUT", "/v1/files/file-x", 405),
    ]:
        answer = await client.request(method, path, json={})
        assert answer.status_code == status, (path, answer.text)
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["message"] == f"Invalid URL ({method} {path})", error
        assert error["type"] == "invalid_request_error"
        if status == 405:
            assert answer.headers["allow"], path
    # batchserve's own routes keep problem+json.
    native = await client.put("/v1/requests")
    assert native.status_code == 405
    assert native.headers["content-type"].startswith("application/problem+json")
