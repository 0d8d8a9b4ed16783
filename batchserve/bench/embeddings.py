"""``batchserve bench --scenario embeddings``: bulk embedding throughput, batched against one at
a time, on a real encoder (all-MiniLM-L6-v2 by default), in one run.

Figures, each in vectors a second over the same kind of texts (short sentences of 8-60 words):

- ``model-one-a-batch``: the encoder in this process, one text a forward pass.
- ``model-batched``: the same, ``micro_batch`` texts a pass (what a worker does with a batch).
- ``service-one-at-a-time``: ``POST /v1/embeddings`` of one text, one call after another, through
  the whole stack (API, Postgres, broker, batcher, worker): every call is a batch of its own.
- ``service-concurrent``: the same calls, 64 in flight: the batcher puts them in batches.
- ``service-batch-job``: a Batch job of one line a text (``/v1/embeddings``), from its creation
  to its completion: the bulk path.

The ratios divide each batched figure by its one-at-a-time one.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from batchserve.models.registry import ModelSpec

WORDS = (
    "the",
    "a",
    "batch",
    "of",
    "texts",
    "runs",
    "through",
    "an",
    "encoder",
    "each",
    "vector",
    "has",
    "unit",
    "length",
    "and",
    "many",
    "requests",
    "share",
    "one",
    "forward",
    "pass",
    "while",
    "the",
    "queue",
    "holds",
    "more",
    "work",
    "for",
    "the",
    "next",
    "slot",
    "durable",
    "results",
    "land",
    "in",
    "postgres",
    "before",
    "any",
    "caller",
    "hears",
    "of",
    "them",
)


def texts(count: int, seed: int) -> list[str]:
    """``count`` distinct sentences of 8-60 words."""
    rng = random.Random(seed)
    return [
        f"{n}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60)))
        for n in range(count)
    ]


@dataclass
class EmbeddingFigure:
    name: str
    vectors: int
    seconds: float
    notes: str = ""

    @property
    def vectors_per_s(self) -> float:
        return self.vectors / self.seconds if self.seconds > 0 else 0.0


@dataclass
class EmbeddingBench:
    model: str
    threads: int
    micro_batch: int
    figures: list[EmbeddingFigure] = field(default_factory=list)

    def figure(self, name: str) -> EmbeddingFigure | None:
        return next((f for f in self.figures if f.name == name), None)

    def ratio(self, name: str, baseline: str) -> float | None:
        top, bottom = self.figure(name), self.figure(baseline)
        if top is None or bottom is None or bottom.vectors_per_s == 0:
            return None
        return top.vectors_per_s / bottom.vectors_per_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": "embeddings",
            "model": self.model,
            "threads": self.threads,
            "micro_batch": self.micro_batch,
            "figures": [
                {
                    "name": f.name,
                    "vectors": f.vectors,
                    "seconds": round(f.seconds, 3),
                    "vectors_per_s": round(f.vectors_per_s, 1),
                    "notes": f.notes,
                }
                for f in self.figures
            ],
            "ratios": {
                "model_batched_vs_one": self.ratio("model-batched", "model-one-a-batch"),
                "service_concurrent_vs_one": self.ratio(
                    "service-concurrent", "service-one-at-a-time"
                ),
                "service_batch_job_vs_one": self.ratio(
                    "service-batch-job", "service-one-at-a-time"
                ),
            },
        }


def run_model(spec: ModelSpec, workload: list[str], per_pass: int, name: str) -> EmbeddingFigure:
    from batchserve.models.embedding import EmbeddingBackend

    backend = EmbeddingBackend(spec)
    backend.run([_item("warm", workload[:per_pass])])
    started = time.perf_counter()
    for start in range(0, len(workload), per_pass):
        chunk = workload[start : start + per_pass]
        results = backend.run([_item(str(start), chunk)])
        assert results[0].error_code is None, results[0]
    seconds = time.perf_counter() - started
    return EmbeddingFigure(name, len(workload), seconds, f"{per_pass} text(s) a forward pass")


def _item(request_id: str, chunk: list[str]) -> Any:
    from batchserve.core.domain import BatchItem

    params = {"input": chunk, "encoding_format": "base64"}
    return BatchItem(request_id, None, None, params, created_at=0.0, received_at=0.0)


async def run_calls(
    url: str, headers: dict[str, str], model: str, workload: list[str], in_flight: int, name: str
) -> EmbeddingFigure:
    """One call a text, ``in_flight`` at a time; each answer checked to hold one vector."""
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in workload:
        queue.put_nowait(text)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=300, limits=limits
    ) as client:

        async def caller() -> None:
            while not queue.empty():
                text = queue.get_nowait()
                body = {"model": model, "input": text, "encoding_format": "base64"}
                response = await client.post("/v1/embeddings", json=body)
                response.raise_for_status()
                assert len(response.json()["data"]) == 1

        started = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        seconds = time.perf_counter() - started
    notes = "one call at a time" if in_flight == 1 else f"{in_flight} calls in flight"
    return EmbeddingFigure(name, len(workload), seconds, notes)


async def run_job(
    url: str, headers: dict[str, str], model: str, workload: list[str], name: str
) -> EmbeddingFigure:
    """A Batch job of one ``/v1/embeddings`` line a text, created to completed."""
    lines = "".join(
        json.dumps(
            {
                "custom_id": f"t-{n}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": model, "input": text, "encoding_format": "base64"},
            }
        )
        + "\n"
        for n, text in enumerate(workload)
    )
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:
        uploaded = await client.post(
            "/v1/files",
            files={"file": ("embed.jsonl", lines.encode())},
            data={"purpose": "batch"},
        )
        uploaded.raise_for_status()
        started = time.perf_counter()
        created = await client.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/embeddings",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        job_id = created.json()["id"]
        while True:
            job = (await client.get(f"/v1/batches/{job_id}")).json()
            if job["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            await asyncio.sleep(0.1)
        seconds = time.perf_counter() - started
    counts = job.get("request_counts") or {}
    if job["status"] != "completed" or counts.get("completed") != len(workload):
        raise RuntimeError(f"the embedding job ended {job['status']}: {counts}")
    return EmbeddingFigure(name, len(workload), seconds, f"a Batch job of {len(workload)} lines")


def _model_toml(name: str, spec: ModelSpec) -> str:
    lines = [f"[models.{name}]", 'backend = "sentence-embedding"']
    for key in ("context_length", "max_batch_size", "max_batch_tokens", "batch_time_ms"):
        value = getattr(spec, key)
        if value is not None:
            lines.append(f"{key} = {json.dumps(value)}")
    for key, value in spec.options.items():
        lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


async def embeddings_scenario(
    spec: ModelSpec,
    *,
    count: int,
    one_at_a_time: int,
    seed: int = 7,
    say: Any = print,
    log_root: Path | None = None,
) -> EmbeddingBench:
    """Every figure of the module docstring, in one run."""
    from batchserve.bench.stack import BenchDeployment, bench_log_dir
    from batchserve.core.settings import load_settings
    from batchserve.models.hf import cpu_threads
    from batchserve.testing.deployment import settled

    micro_batch = int(spec.options.get("micro_batch", 64))
    bench = EmbeddingBench(spec.name, cpu_threads(spec), micro_batch)

    def record(figure: EmbeddingFigure) -> None:
        bench.figures.append(figure)
        say(
            f"{figure.name}: {figure.vectors} vectors in {figure.seconds:.2f} s = "
            f"{figure.vectors_per_s:.1f} vectors/s ({figure.notes})"
        )

    record(run_model(spec, texts(one_at_a_time, seed), 1, "model-one-a-batch"))
    record(run_model(spec, texts(count, seed + 1), micro_batch, "model-batched"))
    name = "bench-embed"
    deployment = BenchDeployment(
        load_settings(),
        {},
        workers=1,
        extra_models={name: _model_toml(name, spec)},
        log_dir=bench_log_dir(log_root),
    )
    async with deployment.running():
        await settled(deployment.stack, _start_model, deployment, name)
        url, headers = deployment.url, deployment.headers
        await run_calls(url, headers, name, texts(16, seed + 2), 4, "warm-up")
        record(
            await run_calls(
                url, headers, name, texts(one_at_a_time, seed + 3), 1, "service-one-at-a-time"
            )
        )
        record(
            await run_calls(url, headers, name, texts(count, seed + 4), 64, "service-concurrent")
        )
        record(await run_job(url, headers, name, texts(count, seed + 5), "service-batch-job"))
    return bench


def _start_model(deployment: Any, name: str) -> None:
    stack = deployment.stack
    stack.start(f"batcher:{name}", "batcher", "--model", name)
    stack.start(f"worker:{name}", "worker", "--model", name)
    stack.wait_slots(name, 1, timeout_s=300)
