"""The model benchmark's client behaves as a well-behaved client: backpressure is waited out."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from batchserve.bench import model as bench_model


async def test_a_refused_submit_waits_as_told_and_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = [
        httpx.Response(503, headers={"Retry-After": "3"}, json={"code": "overloaded"}),
        httpx.Response(503, headers={"Retry-After": "120"}, json={"code": "overloaded"}),
        httpx.Response(202, json={"id": "req_1"}),
    ]
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    transport = httpx.MockTransport(lambda request: answers.pop(0))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        assert (
            await bench_model._submit(client, "m", [{"role": "user", "content": "x"}], 4) == "req_1"
        )
    assert waits == [3.0, 30.0]  # Retry-After, capped


async def test_a_submit_refused_for_good_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_sleep(seconds: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", no_sleep)
    transport = httpx.MockTransport(lambda request: httpx.Response(503, json={}))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        with pytest.raises(httpx.HTTPStatusError):
            await bench_model._submit(client, "m", [], 4)
