"""The real SmolLM2-135M on an engine worker (continuous batching) through the whole stack."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import httpx
import pytest
from typer.testing import CliRunner

from batchserve.cli.main import app
from batchserve.testing.deployment import Stack
from tests.conftest import client_of, deployment, own_database
from tests.support.live import db_rows, wait_terminal

SMOL = "smollm2-135m"
ONE_SEQ = "smollm2-one-seq"  # the same model, an engine of one sequence
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
STORY = "Write a long story about a dragon who guards a library."


def chat(
    question: str, max_tokens: int = 12, model: str = SMOL, **params: object
) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "params": {"max_tokens": max_tokens, "temperature": 0, **params},
    }


async def submit(http: httpx.AsyncClient, body: dict[str, object]) -> str:
    response = await http.post("/v1/requests", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def until_running(http: httpx.AsyncClient, request_id: str) -> None:
    for _ in range(600):
        if (await http.get(f"/v1/requests/{request_id}")).json()["status"] == "running":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{request_id} never started")


def engine_spans(stack: Stack, model: str) -> list[tuple[float, float]]:
    """When each finished request of ``model`` was in its engine: (joined, left), in seconds."""
    rows = db_rows(
        stack,
        "SELECT extract(epoch FROM finished_at), model_ms FROM requests "
        "WHERE model = :m AND model_ms IS NOT NULL",
        m=model,
    )
    return [(float(end) - ms / 1000.0, float(end)) for end, ms in rows]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture(scope="module")
def shared(
    template_db: str, run_id: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One deployment of the real model (and echo) for the tests here that only send it
    requests and read their own: a real-model worker's start (imports, load, the engine's
    measurement of its speed) is 15-30 s here, once instead of once a test. Its worker sits
    idle between the tests (an idle engine is not a stalled one:
    ``test_work_arriving_at_an_idle_engine_does_not_find_it_stalled``)."""
    log_dir = tmp_path_factory.mktemp("real-model")
    with (
        own_database(template_db, run_id, "realmodel") as url,
        deployment(url, f"{run_id}realmodel", log_dir) as stack,
    ):
        stack.start_all({SMOL: 1, ECHO: 1})
        yield stack


@pytest.fixture
async def shared_http(shared: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(shared) as client:
        yield client


async def test_a_long_healthy_generation_is_never_taken_for_poison(
    shared_http: httpx.AsyncClient,
) -> None:
    # First on the shared deployment, so that the batcher's time limit for it comes from the
    # engine's measured speed, as on a fresh deployment, not from what the tests below teach.
    # The registry's limit, all of it generated (end of sequence ignored).
    request_id = await submit(shared_http, chat(STORY, 512, ignore_eos=True))
    result = (await wait_terminal(shared_http, [request_id], timeout_s=600))[request_id]
    assert result["status"] == "succeeded", result
    assert result["usage"]["completion_tokens"] == 512
    assert result["attempts"] == 1 and result["error"] is None


async def test_the_learned_sequence_time_is_live(
    shared: Stack, shared_http: httpx.AsyncClient
) -> None:
    # Second on the shared deployment: one request has finished, fewer than the learner
    # needs (8), so the batcher still goes by the speed the engine measured at its start.
    http = shared_http
    for _ in range(50):  # the batcher reads the worker's announcement every 0.25 s
        model = (await http.get(f"/v1/models/{SMOL}")).json()
        if model["estimate"] and model["estimate"]["source"] != "none":
            break
        await asyncio.sleep(0.1)
    assert model["kind"] == "engine"
    assert model["estimate"]["source"] == "engine-profile"  # measured by the engine at start
    assert model["capacity"]["seqs"] == 32
    ids = [await submit(http, chat(q, 8)) for q in QUESTIONS + QUESTIONS[:2]]
    await wait_terminal(http, ids, timeout_s=300)
    for _ in range(100):  # the batcher learns every 2 s
        model = (await http.get(f"/v1/models/{SMOL}")).json()
        if model["estimate"]["source"] == "learned":
            break
        await asyncio.sleep(0.2)
    estimate = model["estimate"]
    assert estimate["source"] == "learned" and estimate["observations"] >= 8, estimate
    assert estimate["per_token_s"] > 0
    # `batchserve status --json` shows the same belief.
    result = CliRunner().invoke(app, ["status", "--ops-url", shared.ops_url, "--json"])
    assert result.exit_code == 0, result.output
    [row] = [m for m in json.loads(result.output)["models"] if m["model"] == SMOL]
    assert row["kind"] == "engine" and row["estimate"]["source"] == "learned"


async def test_64_chat_requests_and_two_models_at_once(
    shared: Stack, shared_http: httpx.AsyncClient
) -> None:
    smol = [chat(QUESTIONS[i % len(QUESTIONS)] + f" ({i})") for i in range(64)]
    echo: list[dict[str, object]] = [{"model": ECHO, "input": f"echo {i}"} for i in range(64)]
    ids = await asyncio.gather(*(submit(shared_http, b) for b in smol + echo))
    results = await wait_terminal(shared_http, ids, timeout_s=400)
    for request_id in ids[:64]:
        result = results[request_id]
        assert result["status"] == "succeeded", result
        assert result["output"]["text"].strip(), result
        assert result["output"]["finish_reason"] in ("stop", "length")
        assert 0 < result["usage"]["completion_tokens"] <= 12
        assert result["usage"]["prompt_tokens"] > 5  # the chat template's tokens counted
        assert result["attempts"] == 1
    for i, request_id in enumerate(ids[64:]):
        assert results[request_id]["output"]["text"] == f"echo {i}"
    mixed = db_rows(
        shared,
        "SELECT b.id FROM batches b JOIN requests r ON r.batch_id = b.id "
        "GROUP BY b.id HAVING count(DISTINCT r.model) > 1 OR min(r.model) <> min(b.model)",
    )
    assert mixed == []  # every batch held one model
    # The batcher never sent the engine more than it holds (32 sequences in the test
    # registry): at no moment were more requests in it than that.
    peak = most_at_once(engine_spans(shared, SMOL))
    assert 16 <= peak <= 32, peak
    open_batches = db_rows(shared, "SELECT count(*) FROM batches WHERE outcome IS NULL")
    assert open_batches[0][0] == 0  # every batch closed when its last sequence left


async def test_a_short_request_never_waits_for_a_long_one(
    shared_http: httpx.AsyncClient,
) -> None:
    await wait_terminal(
        shared_http, [await submit(shared_http, chat("Warm up.", 2))], timeout_s=120
    )
    long_id = await submit(shared_http, chat(STORY, 160, ignore_eos=True))
    await until_running(shared_http, long_id)
    await asyncio.sleep(1.0)  # well into its generation
    short_id = await submit(shared_http, chat(STORY, 4))
    results = await wait_terminal(shared_http, [short_id, long_id], timeout_s=300)
    short, long = results[short_id], results[long_id]
    assert short["status"] == long["status"] == "succeeded"
    assert short["usage"]["completion_tokens"] == 4
    assert long["usage"]["completion_tokens"] == 160
    finished = {k: datetime.fromisoformat(v["finished_at"]) for k, v in results.items()}
    # It joined the running engine and left as soon as it was done, long before its elder.
    assert finished[short_id] < finished[long_id]
    assert short["timings"]["model_ms"] < long["timings"]["model_ms"] / 5


async def test_a_hopeless_deadline_is_refused_at_submit(
    shared: Stack, shared_http: httpx.AsyncClient
) -> None:
    stored = db_rows(shared, "SELECT count(*) FROM requests")[0][0]
    # 512 tokens cannot be made in one second on this model, whatever the queue.
    for _ in range(50):  # until the batcher has published its load and the engine's speed
        estimate = (await shared_http.get(f"/v1/models/{SMOL}")).json()["estimate"]
        if estimate and estimate["source"] != "none":
            break
        await asyncio.sleep(0.1)
    response = await shared_http.post("/v1/requests", json={**chat(STORY, 512), "timeout_s": 1})
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "deadline_unmeetable"
    assert db_rows(shared, "SELECT count(*) FROM requests")[0][0] == stored  # none stored


def test_a_128_token_answer_streams_token_by_token(shared: Stack) -> None:
    from openai import OpenAI

    from tests.support import keys

    client = OpenAI(base_url=f"{shared.url}/v1", api_key=keys.key(), max_retries=0, timeout=300)
    client.chat.completions.create(  # warm up: the engine's first request pays for its start
        model=SMOL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2
    )
    started = time.monotonic()
    arrivals: list[tuple[float, str]] = []
    for chunk in client.chat.completions.create(
        model=SMOL,
        messages=[{"role": "user", "content": STORY}],
        max_tokens=128,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append((time.monotonic() - started, chunk.choices[0].delta.content))
        elif chunk.usage is not None:
            assert chunk.usage.completion_tokens == 128
    ttft_s, total_s = arrivals[0][0], arrivals[-1][0]
    print(f"\nsmollm2-135m, 128 tokens streamed: TTFT {ttft_s:.3f} s, last {total_s:.3f} s")
    assert len(arrivals) > 32  # piece by piece, not at once
    assert ttft_s < total_s / 4  # the first piece well before the last
    request_id = db_rows(shared, "SELECT id FROM requests ORDER BY created_at DESC LIMIT 1")[0][0]
    [(output, ttft_ms)] = db_rows(
        shared, "SELECT output, ttft_ms FROM requests WHERE id = :id", id=request_id
    )
    assert "".join(text for _, text in arrivals) == output and 0 < ttft_ms < total_s * 1000


# The tests below start deployments of their own.


async def test_cancelling_a_running_generation_frees_its_room_at_once(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({ONE_SEQ: 1})
    await wait_terminal(http, [await submit(http, chat("Warm up.", 2, ONE_SEQ))], timeout_s=120)
    blocker = await submit(http, chat(STORY, 400, ONE_SEQ, ignore_eos=True))
    await until_running(http, blocker)
    # The engine holds one sequence: this one waits in the batcher until there is room.
    waiting = await submit(http, chat(QUESTIONS[0], 4, ONE_SEQ))
    await asyncio.sleep(1.0)
    assert (await http.get(f"/v1/requests/{waiting}")).json()["status"] == "queued"
    cancelled_at = time.time()
    assert (await http.post(f"/v1/requests/{blocker}/cancel")).status_code == 200
    results = await wait_terminal(http, [blocker, waiting], timeout_s=120)
    assert results[blocker]["status"] == "cancelled"
    assert results[waiting]["status"] == "succeeded"
    finished = datetime.fromisoformat(results[waiting]["finished_at"]).timestamp()
    joined = finished - results[waiting]["timings"]["model_ms"] / 1000.0
    # Freed at the engine's next step, refilled by the batcher: no wait for 400 tokens.
    print(f"\ncancel -> next request in the engine: {joined - cancelled_at:.3f} s")
    assert joined - cancelled_at < 3.0
    rows = db_rows(
        stack,
        "SELECT generated_tokens FROM batches WHERE id = :b",
        b=results[blocker]["batch_id"],
    )
    assert rows and rows[0][0] < 400  # the engine stopped generating for it


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
