"""Batch-time estimates: how long a batch of a given shape takes on a worker. Pure.

The seeds' model takes a fixed 100 ms whatever the batch holds. A real model's batch time grows
with its prompts (prefill) and with its longest generation (one forward pass per token for the
whole batch): :class:`LearnedBatchTime` fits that from the batches workers report.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What a batch's run time depends on."""

    size: int
    prompt_tokens: int  # summed over the batch
    max_new_tokens: int  # the longest generation any member may run to


class BatchTimeEstimator(Protocol):
    def batch_s(self, shape: BatchShape) -> float:
        """Expected seconds to run a batch of this shape."""
        ...


@dataclass(frozen=True, slots=True)
class FixedBatchTime:
    """The seeds' model: every batch takes the same time whatever it holds."""

    seconds: float

    def batch_s(self, shape: BatchShape) -> float:
        return self.seconds


class ProfiledSequenceTime:
    """An engine's measured speed as the time of one sequence: its prompt at the prefill rate,
    then a decode step a token. The prior of an engine model's learned time: engines measure it
    when they start, and until one has, there is no engine to send work to anyway
    (``fallback`` answers meanwhile).

    Engines measure a decode step twice: alone and with every row busy. A sequence's estimate
    (what deadlines are held to: admission and expiry ask whether it could finish "even if run
    now") takes the step alone, a lower bound; its time limit (past which it counts as stuck)
    takes the full engine's step, an upper bound. Refusing with the crowded speed turned away a
    512-token request on an idle engine of a busy machine: the full step measured 1.2 s, which
    put it past the ten-minute deadline it would have met several times over.
    """

    def __init__(self, fallback: BatchTimeEstimator) -> None:
        self.fallback = fallback
        self.prefill_tokens_per_s: float | None = None
        self.decode_step_s: float | None = None
        self.decode_step_s_alone: float | None = None

    def set_profile(
        self,
        prefill_tokens_per_s: float,
        decode_step_s: float,
        decode_step_s_alone: float | None = None,
    ) -> None:
        self.prefill_tokens_per_s = max(prefill_tokens_per_s, 1e-6)
        self.decode_step_s = max(decode_step_s, 0.0)
        alone = decode_step_s if decode_step_s_alone is None else decode_step_s_alone
        self.decode_step_s_alone = min(max(alone, 0.0), self.decode_step_s)

    @property
    def measured(self) -> bool:
        return self.prefill_tokens_per_s is not None

    def batch_s(self, shape: BatchShape) -> float:
        if self.prefill_tokens_per_s is None or self.decode_step_s_alone is None:
            return self.fallback.batch_s(shape)
        prompt_per_sequence = shape.prompt_tokens / max(1, shape.size)
        return prompt_per_sequence / self.prefill_tokens_per_s + (
            shape.max_new_tokens * self.decode_step_s_alone
        )


@dataclass(frozen=True, slots=True)
class SequenceCost:
    """One sequence's estimated seconds as ``fixed + per_prompt_token x prompt + per_token x
    max_tokens`` (never under ``floor_s``): how the batcher's estimate travels to the API, so
    deadline admission and the batcher's expiry compute the same number."""

    fixed_s: float
    per_prompt_token_s: float
    per_token_s: float
    floor_s: float = 0.0

    def seconds(self, prompt_tokens: int, max_tokens: int) -> float:
        value = self.fixed_s + self.per_prompt_token_s * prompt_tokens
        return max(value + self.per_token_s * max_tokens, self.floor_s)

    @classmethod
    def of(cls, estimator: BatchTimeEstimator, *, crowded: bool = False) -> SequenceCost | None:
        """The estimator's answer for one sequence as linear terms, where it has them.

        Learned terms are what sequences took, crowded or not; before them the engines'
        measured speed answers: alone, or with ``crowded`` a full engine's (for time limits).
        """
        if isinstance(estimator, LearnedBatchTime):
            terms = estimator.coefficients
            # Where every sequence asked for the same max_tokens the fit cannot tell a token's
            # time from the fixed cost (its columns are collinear), and the least-norm answer
            # can put it below zero: a negative time a token would make every sequence's time
            # limit negative (`bench --scenario streaming` saw each request stopped at its
            # first token). The engines' measured speed answers then.
            if terms is not None and terms[2] + terms[3] > 0:
                fixed, prompt, steps, steps_by_size = terms
                return cls(fixed, prompt, steps + steps_by_size, estimator.floor_s)
            estimator = estimator.prior
        if isinstance(estimator, ProfiledSequenceTime) and estimator.measured:
            step = estimator.decode_step_s if crowded else estimator.decode_step_s_alone
            assert estimator.prefill_tokens_per_s and step is not None
            return cls(0.0, 1.0 / estimator.prefill_tokens_per_s, step)
        return None


def sequence_time_limit_s(generation_s: float) -> float:
    """Past this a sequence's generation counts as stuck and is stopped: four times its
    estimate (its ``max_tokens`` at the learned time a token), and at least a minute more. It
    counts from the sequence's first token, as until then it waits on the prompts of the
    sequences around it (a burst of long prompts takes a while). A long, healthy generation is
    estimated long, so it is never taken for a stuck one."""
    return max(4.0 * generation_s, generation_s + 60.0)


@dataclass(frozen=True, slots=True)
class BatchObservation:
    """A batch a worker ran: its shape and how long the model took."""

    shape: BatchShape
    seconds: float


def features(shape: BatchShape) -> list[float]:
    """Fixed cost; prefill (prompt tokens); decode steps; decode work (steps x rows)."""
    steps = float(shape.max_new_tokens)
    return [1.0, float(shape.prompt_tokens), steps, steps * shape.size]


class LearnedBatchTime:
    """Least squares of batch time on :func:`features`, over the latest ``window`` batches.

    Until ``min_observations`` batches are in it answers with ``prior``. The fit is refreshed
    lazily after new observations; predictions never go below the fastest batch seen, since a
    fitted line can dip below zero far from its data.
    """

    def __init__(
        self,
        prior: BatchTimeEstimator,
        *,
        window: int = 500,
        min_observations: int = 8,
    ) -> None:
        self.prior = prior
        self.min_observations = min_observations
        self._observations: deque[BatchObservation] = deque(maxlen=window)
        self._coefficients: np.ndarray | None = None
        self._stale = False
        self._floor_s = 0.0

    @property
    def num_observations(self) -> int:
        return len(self._observations)

    def observe(self, observation: BatchObservation) -> None:
        if observation.seconds > 0 and observation.shape.size > 0:
            self._observations.append(observation)
            self._stale = True

    def observe_all(self, observations: Iterable[BatchObservation]) -> None:
        for observation in observations:
            self.observe(observation)

    @property
    def floor_s(self) -> float:
        return self._floor_s

    @property
    def learned(self) -> bool:
        """Whether the fit answers (enough batches seen), rather than the prior."""
        self._refit()
        return self._coefficients is not None

    @property
    def coefficients(self) -> tuple[float, ...] | None:
        self._refit()
        return None if self._coefficients is None else tuple(float(c) for c in self._coefficients)

    def batch_s(self, shape: BatchShape) -> float:
        self._refit()
        if self._coefficients is None:
            return self.prior.batch_s(shape)
        predicted = float(np.dot(self._coefficients, features(shape)))
        return max(predicted, self._floor_s)

    def _refit(self) -> None:
        if not self._stale:
            return
        self._stale = False
        if len(self._observations) < self.min_observations:
            return
        x = np.array([features(o.shape) for o in self._observations])
        y = np.array([o.seconds for o in self._observations])
        # Columns can be constant (every batch asked for 256 tokens): lstsq copes (min norm).
        self._coefficients = np.linalg.lstsq(x, y, rcond=None)[0]
        self._floor_s = float(y.min())


@dataclass(frozen=True, slots=True)
class EstimateError:
    """Relative error |predicted - actual| / actual on held-out batches."""

    count: int
    median: float
    p90: float


def held_out_error(
    observations: Sequence[BatchObservation], prior: BatchTimeEstimator, train_share: float = 0.8
) -> EstimateError | None:
    """Fit on the first ``train_share`` of ``observations`` (in order), score the rest."""
    cut = int(len(observations) * train_share)
    train, test = observations[:cut], observations[cut:]
    if not test:
        return None
    model = LearnedBatchTime(prior, window=max(1, len(train)))
    model.observe_all(train)
    errors = sorted(abs(model.batch_s(o.shape) - o.seconds) / o.seconds for o in test)
    return EstimateError(
        count=len(errors),
        median=errors[len(errors) // 2],
        p90=errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)],
    )
