"""The vllm backend: vLLM's engine (its CPU build) on an engine worker, through the whole stack.

vLLM's CPU build pins its own torch and an older transformers, so its worker runs from its own
environment (``make vllm-env`` makes ``.venv-vllm``) and talks to the servers like any role.
Its engine takes a minute to start, so one deployment serves the whole module.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from batchserve.models.engine import SequenceRequest
from batchserve.models.registry import load_registry
from batchserve.models.transformers_engine import TransformersEngine
from batchserve.testing.deployment import ROOT, Stack
from tests.conftest import TEST_MODELS, registered_test_models, server_env
from tests.support import keys, servers
from tests.support.live import db_rows, tree_cpu_s, wait_terminal

VLLM = "smollm2-vllm"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
_SPEC = load_registry(TEST_MODELS).get(VLLM)
assert _SPEC is not None
LIMIT = _SPEC.max_new_tokens  # the registry's limit on max_tokens (256)
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "Explain in one sentence why the sky looks blue during the day.",
    "Write a haiku about autumn leaves falling gently onto a quiet pond.",
    "List the planets of the solar system in order from the Sun.",
    "Summarise this: the committee met on Tuesday to discuss the budget for next year, and "
    "after a long debate about the costs of the new library wing agreed to meet again.",
]


def chat(question: str, max_tokens: int = 24, **params: object) -> dict[str, object]:
    return {
        "model": VLLM,
        "messages": [{"role": "user", "content": question}],
        "params": {"max_tokens": max_tokens, "temperature": 0, **params},
    }


async def submit(http: httpx.AsyncClient, body: dict[str, object]) -> str:
    response = await http.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


@pytest.fixture(scope="module")
def vllm_stack(
    template_db: str, run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    if not VLLM_PYTHON.exists():
        message = f"no vLLM environment at {VLLM_PYTHON.parent.parent} (make vllm-env)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    database = f"{servers.DB_PREFIX}{run_id}_vllm"
    servers.create_database(database, template=template_db)
    namespace = f"{run_id}vllm"
    env = {**os.environ, **server_env(servers.pg_url(database), namespace)}
    stack = Stack(env=env, log_dir=tmp_path_factory.mktemp("vllm"), keys={"tests": keys.key()})
    try:
        stack.start("batcher", "batcher")
        stack.start("maintenance", "maintenance")
        stack.start("worker:vllm", "worker", "--model", VLLM, python=str(VLLM_PYTHON))
        stack.start_api()
        stack.wait_slots(VLLM, 16, timeout_s=400)
        yield stack
    finally:
        stack.stop_all()
        servers.delete_namespace_queues(namespace, registered_test_models())
        servers.drop_database(database)


@pytest.fixture
async def http(vllm_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=vllm_stack.url, timeout=120, headers=keys.auth()
    ) as client:
        yield client


async def test_greedy_answers_equal_the_transformers_engines(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    ids = [await submit(http, chat(q)) for q in QUESTIONS]
    results = await wait_terminal(http, ids, timeout_s=300)

    # The same weights, float32, greedy, in this process on the transformers engine.
    spec = load_registry(TEST_MODELS).get("smollm2-135m")
    assert spec is not None
    engine = TransformersEngine(spec)
    expected: dict[str, str] = {}
    finished: set[str] = set()
    for n, question in enumerate(QUESTIONS):
        engine.add(SequenceRequest(f"t{n}", None, [{"role": "user", "content": question}], 24, 0.0))
    with torch.inference_mode():
        while len(finished) < len(QUESTIONS):
            for update in engine.step():
                expected[update.request_id] = expected.get(update.request_id, "") + update.text
                if update.finished:
                    finished.add(update.request_id)
    for n, request_id in enumerate(ids):
        result = results[request_id]
        assert result["status"] == "succeeded", result
        assert result["output"]["text"] == expected[f"t{n}"], (QUESTIONS[n], result["output"])


async def test_each_request_keeps_its_own_parameters(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    story = "Tell me a story about a dragon who learns to bake bread."
    free_id = await submit(http, chat(story, 30))
    free = (await wait_terminal(http, [free_id], timeout_s=120))[free_id]["output"]["text"]
    stop = f" {free.split()[4]}"
    ids = {
        "length": await submit(http, chat(story, 7, ignore_eos=True)),
        "stopped": await submit(http, chat(story, 30, stop=[stop])),
        "seeded_a": await submit(http, chat(story, 16, temperature=0.9, seed=7)),
        "seeded_b": await submit(http, chat(story, 16, temperature=0.9, seed=7)),
    }
    results = await wait_terminal(http, list(ids.values()), timeout_s=120)
    by = {k: results[v] for k, v in ids.items()}
    assert by["length"]["usage"]["completion_tokens"] == 7
    assert by["length"]["output"]["finish_reason"] == "length"
    assert by["stopped"]["output"]["text"] == free[: free.index(stop)]
    assert by["stopped"]["output"]["finish_reason"] == "stop"
    assert by["seeded_a"]["output"]["text"] == by["seeded_b"]["output"]["text"]


async def test_vllm_honours_a_schema_and_the_sampling_fields(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
    question = "Give me a person's name and age."
    free_id = await submit(http, chat(question, 12))
    free = (await wait_terminal(http, [free_id], timeout_s=120))[free_id]["output"]["text"]
    first = vllm_stack_tokenizer().encode(free, add_special_tokens=False)[0]
    ids = {
        "schema": await submit(http, chat(question, 48, response_format=schema)),
        "object": await submit(http, chat(question, 48, response_format={"type": "json_object"})),
        "biased": await submit(http, chat(question, 12, logit_bias={str(first): -100})),
        "floor": await submit(http, chat("Hi!", 64, min_tokens=40)),
        "topk": await submit(http, chat(question, 12, temperature=1.5, top_k=1, seed=3)),
    }
    results = await wait_terminal(http, list(ids.values()), timeout_s=180)
    by = {k: results[v] for k, v in ids.items()}
    assert all(r["status"] == "succeeded" for r in by.values()), by
    assert set(json.loads(by["schema"]["output"]["text"])) == {"name", "age"}
    assert isinstance(json.loads(by["object"]["output"]["text"]), dict)
    biased = by["biased"]["output"]["text"]
    assert vllm_stack_tokenizer().encode(biased, add_special_tokens=False)[0] != first
    assert by["floor"]["usage"]["completion_tokens"] >= 40
    assert by["topk"]["output"]["text"] == free  # top_k=1 is greedy


def vllm_stack_tokenizer() -> Any:
    from batchserve.models.hf import load_tokenizer

    spec = load_registry(TEST_MODELS).get(VLLM)
    assert spec is not None
    return load_tokenizer(spec)


async def test_cancelling_a_running_sequence_stops_vllm_generating_it(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    request_id = await submit(http, chat("Write a very long story.", LIMIT, ignore_eos=True))
    for _ in range(600):
        if (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "running":
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    assert (await http.post(f"/v1/requests/{request_id}/cancel")).status_code == 200
    result = (await wait_terminal(http, [request_id], timeout_s=60))[request_id]
    assert result["status"] == "cancelled"
    for _ in range(100):
        rows = db_rows(
            vllm_stack,
            "SELECT generated_tokens FROM batches WHERE id = :b",
            b=result["batch_id"],
        )
        if rows and rows[0][0] is not None:
            break
        await asyncio.sleep(0.2)
    assert rows[0][0] < LIMIT  # the engine stopped generating for it


async def test_many_requests_at_once_never_overfill_the_engine(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    ids = await asyncio.gather(
        *(submit(http, chat(f"{QUESTIONS[n % len(QUESTIONS)]} ({n})", 12)) for n in range(40))
    )
    results = await wait_terminal(http, ids, timeout_s=300)
    assert {r["status"] for r in results.values()} == {"succeeded"}
    rows = db_rows(
        vllm_stack,
        "SELECT extract(epoch FROM finished_at), model_ms FROM requests "
        "WHERE id = ANY(CAST(:ids AS uuid[]))",
        ids=list(ids),
    )
    edges = sorted(
        [(float(end) - ms / 1000.0, 1) for end, ms in rows] + [(float(end), -1) for end, _ in rows]
    )
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak <= 16, peak


def test_the_vllm_worker_log_shows_its_engine(vllm_stack: Stack) -> None:
    log = vllm_stack.logs("worker:vllm")
    assert "engine_loaded" in log and "backend=vllm" in log
    assert "executor=uni" in log  # the model in the engine core: no process spinning beside it
    assert "VllmWorker" not in log
    assert "engine_profile" in log
    assert Path(VLLM_PYTHON).exists()


async def test_max_tokens_up_to_the_registry_limit_succeeds(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    worker = vllm_stack.roles["worker:vllm"].pid
    cpu_before, started = tree_cpu_s(worker), time.monotonic()
    request_id = await submit(http, chat("Write a very long story.", LIMIT, ignore_eos=True))
    result = (await wait_terminal(http, [request_id], timeout_s=600))[request_id]
    cpu_s, wall_s = tree_cpu_s(worker) - cpu_before, time.monotonic() - started
    assert result["status"] == "succeeded", result
    assert result["usage"]["completion_tokens"] == LIMIT and result["attempts"] == 1
    # The model runs in the engine-core process on one thread (executor "uni", num_threads
    # 1 on 2 cores): the worker's processes keep one core busy, not two (vLLM's "mp" executor
    # spins its engine core on a second one waiting for every step).
    print(f"\n{LIMIT} tokens on vLLM: {wall_s:.1f} s, the worker's processes {cpu_s:.1f} CPU-s")
    assert cpu_s < 1.3 * wall_s


async def test_vllm_answers_stream_token_by_token(
    vllm_stack: Stack, http: httpx.AsyncClient
) -> None:
    """The vllm backend emits a delta per engine step: the OpenAI SDK's stream of a greedy
    answer arrives in many pieces, and they add up to the same answer asked without a stream."""
    from openai import AsyncOpenAI

    question = QUESTIONS[4]
    whole_id = await submit(http, chat(question, 32, ignore_eos=True))
    whole = (await wait_terminal(http, [whole_id], timeout_s=120))[whole_id]
    assert whole["status"] == "succeeded", whole

    client = AsyncOpenAI(base_url=f"{vllm_stack.url}/v1", api_key=keys.key(), max_retries=0)
    stream = await client.chat.completions.create(
        model=VLLM,
        messages=[{"role": "user", "content": question}],
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    pieces = [
        chunk.choices[0].delta.content
        async for chunk in stream
        if chunk.choices and chunk.choices[0].delta.content
    ]
    await client.close()
    assert len(pieces) >= 8  # 32 tokens: a piece per step, not the answer at the end
    assert "".join(pieces) == whole["output"]["text"]
