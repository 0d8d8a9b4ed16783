"""The official ``openai`` package drives batchserve with nothing but a ``base_url``: the Files and
Batch APIs on a bulk job, cancellation, and the synchronous completions, on real processes."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from openai import OpenAI
from openai.types import Batch
from pydantic import BaseModel

from batchserve.testing.deployment import Stack
from tests.support import keys

ECHO = "echo-100ms"
SMOLLM = "smollm2-135m"


class City(BaseModel):
    name: str
    country: str


def client_of(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key=keys.key(), max_retries=0, timeout=120)


def chat_lines(count: int, prefix: str) -> bytes:
    lines = [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": ECHO,
                "messages": [
                    {"role": "system", "content": "echo"},
                    {"role": "user", "content": f"{prefix} prompt {i}"},
                ],
                "max_tokens": 16,
            },
        }
        for i in range(count)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def wait_status(client: OpenAI, batch_id: str, wanted: set[str], timeout_s: float = 90) -> Batch:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        batch = client.batches.retrieve(batch_id)
        if batch.status in wanted:
            return batch
        time.sleep(0.25)
    raise AssertionError(f"{batch_id} still {batch.status} after {timeout_s} s")


def read_jsonl(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_openai_client_runs_a_batch_cancels_another_and_completes_synchronously(
    stack: Stack,
) -> None:
    stack.start_all({ECHO: 1})
    client = client_of(stack)
    assert ECHO in [m.id for m in client.models.list()]

    chat = client.chat.completions.create(
        model=ECHO,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi!"}],
        max_tokens=8,
        temperature=0,
    )
    assert chat.object == "chat.completion" and chat.choices[0].message.content == "hi!"
    assert chat.choices[0].finish_reason == "stop" and chat.usage is not None
    text = client.completions.create(model=ECHO, prompt="once upon a time", max_tokens=8)
    assert text.object == "text_completion" and text.choices[0].text == "once upon a time"

    uploaded = client.files.create(file=("in.jsonl", chat_lines(300, "a")), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    job = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "e2e"},
    )
    assert job.status == "validating"

    # A second, larger job is cancelled as soon as it runs (it queues behind the first).
    big = client.files.create(file=("big.jsonl", chat_lines(3000, "b")), purpose="batch")
    doomed = client.batches.create(
        input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(client, doomed.id, {"in_progress"})
    assert client.batches.cancel(doomed.id).status in ("cancelling", "cancelled")

    done = wait_status(client, job.id, {"completed", "failed", "expired", "cancelled"})
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (300, 300)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = read_jsonl(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"a-{i}" for i in range(300))
    for line in output:
        body = line["response"]["body"]
        number = line["custom_id"].split("-")[1]
        assert body["choices"][0]["message"]["content"] == f"a prompt {number}"

    cancelled = wait_status(client, doomed.id, {"cancelled"})
    counts = cancelled.request_counts
    assert counts is not None and counts.total == 3000
    assert counts.completed + counts.failed == 3000 and counts.failed > 0
    finished = read_jsonl(client, cancelled.output_file_id)
    unfinished = read_jsonl(client, cancelled.error_file_id)
    assert len(finished) == counts.completed and len(unfinished) == counts.failed
    every = [line["custom_id"] for line in finished + unfinished]
    assert sorted(every) == sorted(f"b-{i}" for i in range(3000))
    assert {line["error"]["code"] for line in unfinished} == {"batch_cancelled"}

    listed = client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [doomed.id] and listed.has_more

    # Files as the SDK lists, expires and deletes them.
    brief = client.files.create(
        file=("brief.jsonl", chat_lines(1, "c")),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert brief.expires_at == brief.created_at + 3600
    files = client.files.list(limit=2, purpose="batch")  # not the batches' output files
    assert [f.id for f in files.data] == [brief.id, big.id] and files.has_more
    assert [f.id for f in client.files.list(order="asc", limit=1).data] == [uploaded.id]
    assert client.files.delete(brief.id).deleted is True
    assert brief.id not in [f.id for f in client.files.list()]


@pytest.mark.slow
def test_openai_chat_completion_on_the_real_model(stack: Stack) -> None:
    stack.start("batcher", "batcher", "--model", SMOLLM)
    stack.start(f"worker:{SMOLLM}", "worker", "--model", SMOLLM, "--slots", "1")
    stack.start_api()
    stack.wait_slots(SMOLLM, 1)
    reply = client_of(stack).chat.completions.create(
        model=SMOLLM,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0,
    )
    content = reply.choices[0].message.content
    assert content and content.strip(), reply
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 8
    assert reply.choices[0].finish_reason in ("stop", "length")
    print(f"\nsmollm2-135m said: {content!r}")

    # Structured output (issue 20, item 1): the SDK's parse() gets an object of its model,
    # decoded under the schema's grammar, and so does LangChain's with_structured_output().
    parsed = client_of(stack).chat.completions.parse(
        model=SMOLLM,
        messages=[{"role": "user", "content": "Give me a city and its country."}],
        response_format=City,
        max_tokens=64,
        temperature=0,
    )
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City) and city.name and city.country, parsed
    print(f"smollm2-135m parsed: {city!r}")
    from langchain_openai import ChatOpenAI

    chain = ChatOpenAI(
        model=SMOLLM,
        base_url=f"{stack.url}/v1",
        api_key=keys.key(),
        max_retries=0,
        temperature=0,
        max_tokens=64,
    ).with_structured_output(City)
    structured = chain.invoke("Name a city and its country.")
    assert isinstance(structured, City) and structured.name, structured
