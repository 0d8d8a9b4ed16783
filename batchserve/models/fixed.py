"""The seeds' model: every batch takes a fixed time whatever its size; output equals input."""

from __future__ import annotations

import time
from collections.abc import Sequence

from batchserve.core.domain import BatchItem, ItemResult
from batchserve.models.base import Backend, OnResult, prompt_text
from batchserve.models.registry import ModelSpec


class FixedBackend(Backend):
    def __init__(self, spec: ModelSpec) -> None:
        self.batch_time_s = spec.batch_time_ms / 1000.0

    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        deadline = time.perf_counter() + self.batch_time_s
        results = [self.answer(item) for item in items]
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        return results

    def answer(self, item: BatchItem) -> ItemResult:
        text = prompt_text(item.input, item.messages)
        tokens = max(1, len(text.split()))
        return ItemResult(
            request_id=item.request_id,
            output=text,
            finish_reason="stop",
            prompt_tokens=tokens,
            completion_tokens=tokens,
        )
