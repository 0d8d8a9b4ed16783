"""Benchmark of a real model in this process: batch time and tokens/s against batch size.

No service involved: it loads the backend as a worker would and times ``run`` on batches of
chat prompts of mixed lengths, greedy, each row generating up to ``max_tokens`` tokens (the
prompts ask for long answers; tokens/s counts what was actually generated). It also times the
same prompts one at a time, to show what batching buys on this hardware.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from batching.estimate import (
    BatchObservation,
    BatchShape,
    FixedBatchTime,
    LearnedBatchTime,
    held_out_error,
)
from batching.policy import PolicyConfig
from batching.simulator import Arrival, SimResult, simulate
from core.domain import BatchItem
from models.loader import load_backend
from models.registry import ModelSpec

PROMPTS = [
    "Tell me a story about a lighthouse keeper.",
    "Explain how a bicycle works, in detail, for a curious child who asks a lot of questions.",
    "Write a poem about rain.",
    "Describe the water cycle step by step, including evaporation, condensation and precipitation.",
    "List some fruits and what they taste like.",
    "What happens inside a star over its whole life?",
    "Write a letter to a friend about a trip to the mountains last summer.",
    "Explain what a database index is.",
]


@dataclass(frozen=True, slots=True)
class SizePoint:
    batch_size: int
    batch_s: float
    generated_tokens: int
    tokens_per_s: float
    requests_per_s: float


@dataclass(frozen=True, slots=True)
class EstimateReport:
    """The learned batch time on batches it was not fitted on."""

    batches: int
    held_out: int
    median_relative_error: float
    p90_relative_error: float
    coefficients: tuple[float, ...]  # seconds: fixed, per prompt token, per step, per step x row


@dataclass(frozen=True, slots=True)
class GroupingReport:
    """Short requests' latency in a mixed short/long workload, simulated with the real policy
    and this machine's learned batch time, with and without length classes."""

    rate_rps: float
    short_share: float
    short_max_tokens: int
    long_max_tokens: int
    short_p90_s_grouped: float
    short_p90_s_mixed: float
    long_p90_s_grouped: float
    long_p90_s_mixed: float


@dataclass(frozen=True, slots=True)
class ModelBench:
    model: str
    max_tokens: int
    points: list[SizePoint]
    one_at_a_time_tokens_per_s: float
    batched_tokens_per_s: float
    batched_vs_one_at_a_time: float  # throughput ratio at the largest batch size
    estimate: EstimateReport | None = None
    grouping: GroupingReport | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _items(count: int, max_tokens: int, tag: str) -> list[BatchItem]:
    now = time.time()
    return [
        BatchItem(
            request_id=f"{tag}-{i}",
            input=None,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            params={"max_tokens": max_tokens, "temperature": 0},
            created_at=now,
            received_at=now,
        )
        for i in range(count)
    ]


def bench_model(
    spec: ModelSpec,
    sizes: list[int],
    max_tokens: int = 32,
    repeats: int = 2,
    estimate_batches: int = 0,
) -> ModelBench:
    backend = load_backend(spec)
    backend.run(_items(2, 4, "warm"))
    points = []
    for size in sizes:
        times, tokens = [], 0
        for r in range(repeats):
            started = time.perf_counter()
            results = backend.run(_items(size, max_tokens, f"b{size}-{r}"))
            times.append(time.perf_counter() - started)
            tokens = sum(x.completion_tokens for x in results)
        batch_s = statistics.median(times)
        points.append(SizePoint(size, batch_s, tokens, tokens / batch_s, size / batch_s))
    largest = max(sizes)
    singles = _items(largest, max_tokens, "single")
    started = time.perf_counter()
    single_tokens = sum(backend.run([item])[0].completion_tokens for item in singles)
    single_rate = single_tokens / (time.perf_counter() - started)
    batched_rate = next(p.tokens_per_s for p in points if p.batch_size == largest)
    estimate = grouping = None
    if estimate_batches:
        estimate, fitted = _estimate(backend, spec, estimate_batches)
        grouping = _grouping(spec, fitted)
    return ModelBench(
        model=spec.name,
        max_tokens=max_tokens,
        points=points,
        one_at_a_time_tokens_per_s=single_rate,
        batched_tokens_per_s=batched_rate,
        batched_vs_one_at_a_time=batched_rate / single_rate,
        estimate=estimate,
        grouping=grouping,
    )


def _estimate(
    backend: Any, spec: ModelSpec, count: int, seed: int = 7
) -> tuple[EstimateReport, LearnedBatchTime]:
    """Run ``count`` batches of random shapes (size, prompts, max_tokens), the way workers
    report them, fit on the first 75 % and score the rest."""
    rng = random.Random(seed)
    observations: list[BatchObservation] = []
    for index in range(count):
        size = rng.randint(1, spec.max_batch_size)
        steps = rng.choice((8, 16, 32, 48, 64))
        items = []
        for item in _items(size, steps, f"e{index}"):
            words = " ".join(rng.choice(PROMPTS).split()[: rng.randint(3, 14)])
            content = " ".join([words] * rng.randint(1, 4))
            messages = [{"role": "user", "content": content}]
            items.append(dataclasses.replace(item, messages=messages))
        started = time.perf_counter()
        results = backend.run(items)
        seconds = time.perf_counter() - started
        prompt = sum(r.prompt_tokens for r in results)
        longest = max(r.completion_tokens for r in results)
        observations.append(BatchObservation(BatchShape(size, prompt, longest), seconds))
    prior = FixedBatchTime(spec.batch_time_ms / 1000.0)
    error = held_out_error(observations, prior, train_share=0.75)
    assert error is not None
    fitted = LearnedBatchTime(prior, window=len(observations), min_observations=4)
    fitted.observe_all(observations)
    report = EstimateReport(
        batches=len(observations),
        held_out=error.count,
        median_relative_error=error.median,
        p90_relative_error=error.p90,
        coefficients=fitted.coefficients or (),
    )
    return report, fitted


def _grouping(spec: ModelSpec, fitted: LearnedBatchTime) -> GroupingReport:
    """Short (16 tokens) and long (256 tokens) requests, 80/20, at about 60 % of what one slot
    can carry; short requests' p90 with length classes and without."""
    short, long_, share = 16, 256, 0.8
    mean_batch_s = fitted.batch_s(BatchShape(spec.max_batch_size, 30 * spec.max_batch_size, long_))
    rate = 0.6 * spec.max_batch_size / mean_batch_s
    rng = random.Random(11)
    arrivals, at = [], 0.0
    for index in range(1500):
        at += rng.expovariate(rate)
        tokens = short if rng.random() < share else long_
        arrivals.append(
            Arrival(
                at, f"{'s' if tokens == short else 'l'}{index}", prompt_tokens=30, max_tokens=tokens
            )
        )
    base = PolicyConfig(
        kind="adaptive",
        max_batch_size=spec.max_batch_size,
        max_batch_delay_s=spec.batch_delay_ms / 1000.0,
    )

    def p90(result: SimResult, prefix: str) -> float:
        values = sorted(
            o.latency_s
            for k, o in result.outcomes.items()
            if k.startswith(prefix) and o.latency_s is not None
        )
        return values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)]

    grouped = simulate(
        arrivals,
        workers=1,
        config=dataclasses.replace(base, length_edges=(short, long_)),
        estimator=fitted,
    )
    mixed = simulate(arrivals, workers=1, config=base, estimator=fitted)
    return GroupingReport(
        rate_rps=rate,
        short_share=share,
        short_max_tokens=short,
        long_max_tokens=long_,
        short_p90_s_grouped=p90(grouped, "s"),
        short_p90_s_mixed=p90(mixed, "s"),
        long_p90_s_grouped=p90(grouped, "l"),
        long_p90_s_mixed=p90(mixed, "l"),
    )


def plot_model_bench(result: ModelBench, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [p.batch_size for p in result.points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    left.plot(sizes, [p.batch_s for p in result.points], marker="o")
    left.set_xlabel("batch size")
    left.set_ylabel("batch time (s)")
    left.set_xscale("log", base=2)
    left.grid(True, alpha=0.3)
    right.plot(sizes, [p.tokens_per_s for p in result.points], marker="o", label="batched")
    right.axhline(
        result.one_at_a_time_tokens_per_s, color="grey", linestyle="--", label="one at a time"
    )
    right.set_xlabel("batch size")
    right.set_ylabel("generated tokens/s")
    right.set_xscale("log", base=2)
    right.grid(True, alpha=0.3)
    right.legend()
    fig.suptitle(f"{result.model}, {result.max_tokens} new tokens a request")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
