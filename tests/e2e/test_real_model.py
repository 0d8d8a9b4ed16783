"""The real SmolLM2-135M through the whole stack, beside the fixed model."""

from __future__ import annotations

import asyncio
from datetime import datetime

import httpx

from cli.deployment import Stack
from tests.support.live import db_rows, wait_terminal

SMOL = "smollm2-135m"
ECHO = "echo-100ms"

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "Say hello in Spanish.",
    "What is two plus two?",
    "Give me a synonym for happy.",
    "What do bees make?",
    "Which planet do we live on?",
    "What colour is the sky on a clear day?",
]


def chat(question: str, max_tokens: int = 12, **params: object) -> dict[str, object]:
    return {
        "model": SMOL,
        "messages": [{"role": "user", "content": question}],
        "params": {"max_tokens": max_tokens, "temperature": 0, **params},
    }


async def submit(http: httpx.AsyncClient, body: dict[str, object]) -> str:
    response = await http.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_64_chat_requests_and_two_models_at_once(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({SMOL: 1, ECHO: 1})
    smol = [chat(QUESTIONS[i % len(QUESTIONS)] + f" ({i})") for i in range(64)]
    echo: list[dict[str, object]] = [{"model": ECHO, "input": f"echo {i}"} for i in range(64)]
    ids = await asyncio.gather(*(submit(http, b) for b in smol + echo))
    results = await wait_terminal(http, ids, timeout_s=400)
    for request_id in ids[:64]:
        result = results[request_id]
        assert result["status"] == "succeeded", result
        assert result["output"]["text"].strip(), result
        assert result["output"]["finish_reason"] in ("stop", "length")
        assert 0 < result["usage"]["completion_tokens"] <= 12
        assert result["usage"]["prompt_tokens"] > 5  # the chat template's tokens counted
    for i, request_id in enumerate(ids[64:]):
        assert results[request_id]["output"]["text"] == f"echo {i}"
    mixed = db_rows(
        stack,
        "SELECT b.id FROM batches b JOIN requests r ON r.batch_id = b.id "
        "GROUP BY b.id HAVING count(DISTINCT r.model) > 1 OR min(r.model) <> min(b.model)",
    )
    assert mixed == []  # every batch held one model
    assert (
        max(r[0] for r in db_rows(stack, "SELECT size FROM batches WHERE model = :m", m=SMOL)) <= 8
    )


async def test_a_short_answer_returns_before_its_long_batchmate(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({SMOL: 1})
    await wait_terminal(http, [await submit(http, chat("Warm up.", 2))], timeout_s=120)
    # While the slot is busy, both wait and leave together: max_tokens 4 and 32 are in the
    # same length class (up to 32), so they share a batch.
    story = "Write a long story about a dragon who guards a library."
    blocker = await submit(http, chat(story, 24))
    for _ in range(200):
        if (await http.get(f"/v1/requests/{blocker}")).json()["status"] == "running":
            break
        await asyncio.sleep(0.05)
    short_id, long_id = await asyncio.gather(
        submit(http, chat(story, 4)), submit(http, chat(story, 32))
    )
    results = await wait_terminal(http, [short_id, long_id], timeout_s=120)
    short, long = results[short_id], results[long_id]
    assert short["batch_id"] == long["batch_id"]
    assert short["usage"]["completion_tokens"] == 4 and short["output"]["finish_reason"] == "length"
    assert long["usage"]["completion_tokens"] > 4
    finished = {k: datetime.fromisoformat(v["finished_at"]) for k, v in results.items()}
    assert finished[short_id] < finished[long_id]  # written the moment its row stopped


async def test_cancelling_a_running_generation_stops_it(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({SMOL: 1})
    await wait_terminal(http, [await submit(http, chat("Warm up.", 2))], timeout_s=120)
    request_id = await submit(http, chat("Write a long story about a dragon.", 400))
    for _ in range(200):  # until its batch is running
        if (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "running":
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    assert (await http.post(f"/v1/requests/{request_id}/cancel")).status_code == 200
    result = (await wait_terminal(http, [request_id], timeout_s=60))[request_id]
    assert result["status"] == "cancelled"
    for _ in range(100):
        rows = db_rows(
            stack, "SELECT generated_tokens FROM batches WHERE id = :b", b=result["batch_id"]
        )
        if rows and rows[0][0] is not None:
            break
        await asyncio.sleep(0.2)
    assert rows[0][0] < 400  # the model stopped generating for it


async def test_a_prompt_longer_than_the_context_is_refused_at_admission(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_api()
    body = chat("word " * 9000, 16)
    for _ in range(100):  # the API loads the tokenizer in the background at start-up
        response = await http.post("/v1/requests", json=body)
        if response.status_code != 202:
            break
        await asyncio.sleep(0.2)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "context_length_exceeded" and problem["field"] == "messages"
    assert problem["limit"]["context_length"] == 8192
