"""Capacity arithmetic: workers needed for a request rate, from batch size and batch time. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerOption:
    workers: int
    capacity_rps: float
    utilization: float  # offered rate / capacity; above 1 the queue grows without bound


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    rate_rps: float
    max_batch: int
    batch_time_s: float
    mean_batch: float
    headroom: float
    per_worker_rps: float
    ideal_per_worker_rps: float  # with every batch full
    min_workers: int
    recommended_workers: int
    options: tuple[WorkerOption, ...]

    @property
    def min_utilization(self) -> float:
        return self.rate_rps / (self.min_workers * self.per_worker_rps)

    @property
    def recommended_utilization(self) -> float:
        return self.rate_rps / (self.recommended_workers * self.per_worker_rps)

    def explain(self) -> str:
        """The arithmetic in one paragraph."""
        fewer = self.min_workers - 1
        text = (
            f"Each worker finishes one batch every {self.batch_time_s:.3f} s, so with "
            f"{self.mean_batch:g} requests a batch it serves {self.mean_batch:g} / "
            f"{self.batch_time_s:.3f} = {self.per_worker_rps:.0f} requests/s. "
            f"{self.rate_rps:g} requests/s need {self.rate_rps:g} / {self.per_worker_rps:.0f} = "
            f"{self.rate_rps / self.per_worker_rps:.2f}, so {self.min_workers} workers at minimum"
        )
        if fewer > 0:
            text += (
                f"; {fewer} give only {fewer * self.per_worker_rps:.0f}/s and the queue grows "
                "without bound"
            )
        text += (
            f". Running at the minimum leaves {1 - self.min_utilization:.0%} for bursts; with "
            f"{self.headroom:.0%} headroom (at most {1 - self.headroom:.0%} busy) it takes "
            f"{self.rate_rps:g} / ({self.per_worker_rps:.0f} x {1 - self.headroom:.2f}) = "
            f"{self.rate_rps / (self.per_worker_rps * (1 - self.headroom)):.2f}, so "
            f"{self.recommended_workers} workers. These figures assume no overhead between batches."
        )
        if self.mean_batch < self.max_batch:
            text += (
                f" Batches averaging {self.mean_batch:g} of {self.max_batch} cut a worker's "
                f"capacity from {self.ideal_per_worker_rps:.0f}/s to {self.per_worker_rps:.0f}/s: "
                f"the same rate needs {self.ideal_per_worker_rps / self.per_worker_rps:.1f} times "
                "the workers."
            )
        return text


def plan_capacity(
    *,
    rate_rps: float,
    max_batch: int,
    batch_time_s: float,
    mean_batch: float | None = None,
    headroom: float = 0.25,
) -> CapacityPlan:
    if rate_rps <= 0 or max_batch < 1 or batch_time_s <= 0:
        raise ValueError("rate, max batch and batch time must be positive")
    if not 0 <= headroom < 1:
        raise ValueError("headroom must be in [0, 1)")
    mean = float(mean_batch if mean_batch is not None else max_batch)
    if not 0 < mean <= max_batch:
        raise ValueError("the mean batch must be in (0, max batch]")
    per_worker = mean / batch_time_s
    minimum = max(1, math.ceil(rate_rps / per_worker - 1e-9))
    recommended = max(minimum, math.ceil(rate_rps / (per_worker * (1 - headroom)) - 1e-9))
    options = tuple(
        WorkerOption(w, w * per_worker, rate_rps / (w * per_worker))
        for w in range(max(1, minimum - 1), recommended + 2)
    )
    return CapacityPlan(
        rate_rps=rate_rps,
        max_batch=max_batch,
        batch_time_s=batch_time_s,
        mean_batch=mean,
        headroom=headroom,
        per_worker_rps=per_worker,
        ideal_per_worker_rps=max_batch / batch_time_s,
        min_workers=minimum,
        recommended_workers=recommended,
        options=options,
    )


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one typical request asks of an engine, and how fast the engine goes."""

    max_num_seqs: int
    prefill_tokens_per_s: float
    decode_step_s: float  # one step with every sequence slot busy
    prompt_tokens: float  # of a typical request
    generated_tokens: float

    @property
    def engine_s_per_request(self) -> float:
        """The engine's time one request costs: its whole prefill (which holds the engine),
        and its share of the decode steps it rides (each step serves every sequence)."""
        prefill_s = self.prompt_tokens / self.prefill_tokens_per_s
        return prefill_s + self.generated_tokens * self.decode_step_s / self.max_num_seqs


def plan_engine_capacity(
    *, rate_rps: float, load: EngineLoad, headroom: float = 0.25
) -> CapacityPlan:
    """Engines (continuous batching) needed for ``rate_rps``: each, kept full, finishes a
    request every ``engine_s_per_request`` seconds. Expressed as the batch plan of an engine
    finishing ``max_num_seqs`` requests every ``max_num_seqs x engine_s_per_request``."""
    return plan_capacity(
        rate_rps=rate_rps,
        max_batch=load.max_num_seqs,
        batch_time_s=load.max_num_seqs * load.engine_s_per_request,
        headroom=headroom,
    )
