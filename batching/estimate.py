"""Batch-time estimates: how long a batch of a given shape takes on a worker. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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
