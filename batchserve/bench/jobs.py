"""Bulk jobs for benchmarks: a JSONL file of requests, uploaded and started over the API."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

ENDED = ("completed", "failed", "expired", "cancelled")


def jsonl(model: str, count: int, tag: str) -> bytes:
    """``count`` ``/v1/completions`` lines for ``model``, each with its own prompt."""
    lines = (
        orjson.dumps(
            {
                "custom_id": f"{tag}-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": model, "prompt": f"{tag} prompt {i}", "max_tokens": 16},
            }
        )
        for i in range(count)
    )
    return b"\n".join(lines) + b"\n"


@dataclass(frozen=True, slots=True)
class StartedJob:
    id: str
    requests: int
    upload_s: float
    created_at: float  # time.time() when POST /v1/batches returned


async def start_job(
    url: str, headers: dict[str, str], model: str, count: int, tag: str
) -> StartedJob:
    """Upload a ``count``-line file and create a job from it (it starts validating at once)."""
    content = jsonl(model, count, tag)
    async with aiohttp.ClientSession(url, headers=headers) as session:
        started = time.perf_counter()
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename=f"{tag}.jsonl")
        async with session.post("/v1/files", data=form) as response:
            uploaded = await _json(response)
        upload_s = time.perf_counter() - started
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/completions",
            "completion_window": "24h",
        }
        async with session.post("/v1/batches", json=body) as response:
            job = await _json(response)
    return StartedJob(job["id"], count, upload_s, time.time())


async def wait_job(
    url: str, headers: dict[str, str], job_id: str, statuses: tuple[str, ...], timeout_s: float
) -> dict[str, Any]:
    """Poll the job until its status is one of ``statuses`` (or it ended)."""
    give_up = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(url, headers=headers) as session:
        while True:
            async with session.get(f"/v1/batches/{job_id}") as response:
                job = await _json(response)
            if job["status"] in statuses or job["status"] in ENDED:
                return job
            if time.monotonic() > give_up:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s:.0f} s")
            await asyncio.sleep(0.1)


async def get_job(url: str, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession(url, headers=headers) as session,
        session.get(f"/v1/batches/{job_id}") as response,
    ):
        return await _json(response)


async def _json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    body = await response.read()
    if response.status >= 300:
        raise RuntimeError(f"{response.method} {response.url}: {response.status} {body[:300]!r}")
    document: dict[str, Any] = orjson.loads(body)
    return document


def job_uuid(job_id: str) -> str:
    return job_id.removeprefix("batch_")
