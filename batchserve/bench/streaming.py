"""``batchserve bench --scenario streaming``: what ``stream: true`` costs, and an outside
client's view of the streams.

For each model one deployment (API, maintenance, the model's batcher and worker) serves the
same workload twice over ``POST /v1/chat/completions``: once answered whole (``plain``) and
once streamed (``stream``, with ``stream_options.include_usage``). The requests are the same
chat prompts in the same order, sent closed-loop by ``concurrency`` clients (each sends its
next request when its answer is in), so the service runs saturated and any cost of streaming
shows as fewer requests served a second. Rounds alternate in ABBA order (plain, stream,
stream, plain, ...) after a warm-up of both, so that a drift of the shared machine's speed
during the run falls on both variants alike. Throughput of a variant is its requests (and
completion tokens) over its rounds' summed wall time; the ratio is streamed over plain.

Then, with ``client``, the external benchmark client (``batchserve/bench/client.py``: aiperf in its
own environment, the model's tokenizer from local files) runs against the same deployment
with streaming on, and its TTFT, inter-token latency and throughput are reported beside ours.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from batchserve.bench.model import WORDS
from batchserve.bench.stack import BenchDeployment, cpu_per, percentile

PLAIN, STREAM = "plain", "stream"


@dataclass(frozen=True, slots=True)
class Workload:
    """One model's part of the run: how many requests a round, answers of how many tokens."""

    model: str
    requests: int
    max_tokens: int
    prompt_words: int = 24


@dataclass(frozen=True, slots=True)
class StreamingPlan:
    workloads: list[Workload]
    concurrency: int = 64
    pairs: int = 4  # of rounds, in ABBA order: 2 -> plain, stream, stream, plain
    workers: int = 2  # slots of a batch model's worker
    client: bool = True  # then the client sends a round's requests, streaming
    client_timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Answer:
    """One request as the client saw it."""

    ok: bool
    completion_tokens: int = 0
    latency_s: float = 0.0
    ttft_s: float | None = None  # streamed: until the first piece of text
    pieces: int = 0  # streamed: chunks carrying text


@dataclass(frozen=True, slots=True)
class Round:
    variant: str
    requests: int
    errors: int
    seconds: float
    completion_tokens: int
    latency_p50_ms: float
    ttft_p50_ms: float | None = None
    pieces_mean: float | None = None
    # CPU ms a request of each role (the API, batcher, worker with its pool, maintenance):
    # unlike throughput it hardly moves with what else the machine runs.
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else math.nan

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else math.nan


def parse_workloads(text: str, max_tokens: int) -> list[Workload]:
    """``echo-100ms:640,smollm2-135m:64``: each model and its requests a round."""
    workloads = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, _, count = part.rpartition(":")
        if not model or not count.isdigit() or int(count) < 1:
            raise ValueError(f"{part!r}: give MODEL:REQUESTS, e.g. echo-100ms:640")
        workloads.append(Workload(model, int(count), max_tokens))
    if not workloads:
        raise ValueError("name at least one MODEL:REQUESTS")
    return workloads


def abba(pairs: int) -> list[str]:
    """The order of the measured rounds: plain, stream, stream, plain, repeated ``pairs``
    times, so a linear drift of the machine's speed weighs on both variants equally."""
    return [PLAIN, STREAM, STREAM, PLAIN] * (pairs // 2) + [PLAIN, STREAM] * (pairs % 2)


def totals(rounds: Sequence[Round], variant: str) -> dict[str, Any]:
    """A variant's throughput over its rounds: requests and tokens over their summed time."""
    mine = [r for r in rounds if r.variant == variant]
    seconds = sum(r.seconds for r in mine)
    requests = sum(r.requests for r in mine)
    tokens = sum(r.completion_tokens for r in mine)
    roles = sorted({role for r in mine for role in r.cpu_ms})
    cpu_ms = {
        role: round(sum(r.cpu_ms.get(role, 0.0) * r.requests for r in mine) / requests, 3)
        for role in roles
        if requests
    }
    return {
        "rounds": len(mine),
        "requests": requests,
        "errors": sum(r.errors for r in mine),
        "seconds": round(seconds, 3),
        "rps": round(requests / seconds, 2) if seconds > 0 else math.nan,
        "tokens_per_s": round(tokens / seconds, 2) if seconds > 0 else math.nan,
        "cpu_ms": cpu_ms,
        "cpu_ms_total": round(sum(cpu_ms.values()), 3) if cpu_ms else math.nan,
    }


def comparison(rounds: Sequence[Round]) -> dict[str, Any]:
    """Both variants' throughput and the ratios streamed / plain (1.0: streaming is free;
    the goal is at least 0.95): over all rounds; the median of each pair of neighbouring
    rounds' (robust to a burst of other work on the machine during one pair); and the CPU
    of the roles a request, plain over streamed (what a CPU-bound service keeps of its
    throughput when it streams)."""
    plain, stream = totals(rounds, PLAIN), totals(rounds, STREAM)
    pairs = [
        _ratio(b.rps, a.rps) if a.variant == PLAIN else _ratio(a.rps, b.rps)
        for a, b in zip(rounds[::2], rounds[1::2], strict=False)
        if {a.variant, b.variant} == {PLAIN, STREAM}
    ]
    return {
        PLAIN: plain,
        STREAM: stream,
        "rps_ratio": _ratio(stream["rps"], plain["rps"]),
        "tokens_ratio": _ratio(stream["tokens_per_s"], plain["tokens_per_s"]),
        "pair_rps_ratios": pairs,
        "median_pair_rps_ratio": round(statistics.median(pairs), 4) if pairs else math.nan,
        "cpu_ratio": _ratio(plain["cpu_ms_total"], stream["cpu_ms_total"]),
    }


def _ratio(a: float, b: float) -> float:
    return round(a / b, 4) if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def chat_bodies(workload: Workload, stream: bool) -> list[dict[str, Any]]:
    """The round's requests: prompt ``n`` the same in every round and both variants."""
    bodies = []
    for n in range(workload.requests):
        words = [WORDS[(n + k) % len(WORDS)] for k in range(workload.prompt_words)]
        body: dict[str, Any] = {
            "model": workload.model,
            "messages": [{"role": "user", "content": f"request {n}: " + " ".join(words)}],
            "max_tokens": workload.max_tokens,
            "temperature": 0,
            "ignore_eos": True,  # every answer max_tokens long on a real model
        }
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        bodies.append(body)
    return bodies


async def closed_loop(
    url: str,
    headers: dict[str, str],
    bodies: Sequence[dict[str, Any]],
    concurrency: int,
    timeout_s: float = 600.0,
) -> tuple[list[Answer], float]:
    """Send ``bodies`` from ``concurrency`` clients, each its next when its answer is in;
    the answers and the wall time from the first sent to the last answered."""
    answers: list[Answer] = []
    queue = iter(bodies)
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=timeout, headers=headers
    ) as session:

        async def client() -> None:
            for body in queue:
                answers.append(await _one(session, body))

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return answers, seconds


async def _one(session: aiohttp.ClientSession, body: dict[str, Any]) -> Answer:
    started = time.perf_counter()
    try:
        async with session.post("/v1/chat/completions", json=body) as response:
            if response.status != 200:
                await response.read()
                return Answer(ok=False)
            if not body.get("stream"):
                usage = (await response.json())["usage"]
                return Answer(True, usage["completion_tokens"], time.perf_counter() - started)
            return await _read_stream(response, started)
    except (TimeoutError, aiohttp.ClientError, KeyError, ValueError):
        return Answer(ok=False)


async def _read_stream(response: aiohttp.ClientResponse, started: float) -> Answer:
    """Read an OpenAI chunk stream to ``[DONE]``: when text first came, how many pieces, the
    usage of its last chunk; not ok when it ends with an error or without usage."""
    first: float | None = None
    pieces = 0
    tokens: int | None = None
    async for raw in response.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            # Read on to the response's end, which comes right after: a connection left
            # mid-response is closed, not reused, and the next request would pay for a new one.
            continue
        chunk = orjson.loads(data)
        if "error" in chunk:
            return Answer(ok=False)
        if chunk.get("usage"):
            tokens = int(chunk["usage"]["completion_tokens"])
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                pieces += 1
                first = first if first is not None else time.perf_counter() - started
    if tokens is None:
        return Answer(ok=False)
    return Answer(True, tokens, time.perf_counter() - started, first, pieces)


def summarise(variant: str, answers: Sequence[Answer], seconds: float) -> Round:
    """A round's figures from its answers (only those that succeeded count as served)."""
    ok = [a for a in answers if a.ok]
    ttfts = [a.ttft_s * 1000.0 for a in ok if a.ttft_s is not None]
    return Round(
        variant=variant,
        requests=len(ok),
        errors=len(answers) - len(ok),
        seconds=round(seconds, 3),
        completion_tokens=sum(a.completion_tokens for a in ok),
        latency_p50_ms=round(percentile([a.latency_s * 1000.0 for a in ok], 0.5), 2),
        ttft_p50_ms=round(percentile(ttfts, 0.5), 2) if ttfts else None,
        pieces_mean=round(sum(a.pieces for a in ok) / len(ok), 2)
        if ok and variant == STREAM
        else None,
    )


@dataclass
class ModelResult:
    model: str
    kind: str  # batch or engine
    workload: dict[str, Any]
    concurrency: int
    order: list[str]
    rounds: list[Round] = field(default_factory=list)
    client: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "kind": self.kind,
            "workload": self.workload,
            "concurrency": self.concurrency,
            "order": self.order,
            "rounds": [
                {**asdict(r), "rps": round(r.rps, 2), "tokens_per_s": round(r.tokens_per_s, 2)}
                for r in self.rounds
            ],
            **comparison(self.rounds),
            "client": self.client,
        }


async def compare_model(
    deployment: BenchDeployment,
    workload: Workload,
    plan: StreamingPlan,
    kind: str,
    say: Callable[[str], Any] = print,
) -> ModelResult:
    """The plain and streamed rounds of one model, on a deployment already serving it."""
    result = ModelResult(workload.model, kind, asdict(workload), plan.concurrency, abba(plan.pairs))
    # Warm-up: a whole round each way, left out of the figures. With only 8 requests the first
    # measured round still ran at under half the speed of the others (14-17/s against 30-50/s
    # on echo-100ms, in three runs), and it is always a plain one.
    warm = workload
    for variant in (PLAIN, STREAM):
        await closed_loop(
            deployment.url,
            deployment.headers,
            chat_bodies(warm, variant == STREAM),
            plan.concurrency,
        )
    for variant in result.order:
        bodies = chat_bodies(workload, variant == STREAM)
        cpu_before = deployment.cpu_s()
        answers, seconds = await closed_loop(
            deployment.url, deployment.headers, bodies, plan.concurrency
        )
        figures = summarise(variant, answers, seconds)
        cpu_ms = cpu_per(cpu_before, deployment.cpu_s(), figures.requests)
        figures = Round(**{**asdict(figures), "cpu_ms": cpu_ms})
        result.rounds.append(figures)
        say(
            f"{workload.model} {variant}: {figures.requests} requests in {figures.seconds:.2f} s "
            f"= {figures.rps:.1f}/s, {figures.tokens_per_s:.1f} tokens/s"
            + (f", {figures.errors} errors" if figures.errors else "")
        )
    return result
