"""A test-only backend: markers in an input make the batch raise, the process die, or stall.

``[[raise]]`` raises (the whole batch fails), ``[[crash]]`` kills the process, ``[[stall]]`` hangs
for ``stall_s`` (default: an hour), ``[[item-error]]`` fails that item alone. Without markers it
behaves like the fixed backend. Registries outside tests never name it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

from batchserve.core.domain import BatchItem, ItemResult
from batchserve.models.base import OnResult, prompt_text
from batchserve.models.fixed import FixedBackend
from batchserve.models.registry import ModelSpec


class FaultyBackend(FixedBackend):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.stall_s = float(spec.options.get("stall_s", 3600))

    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        texts = [prompt_text(item.input, item.messages) for item in items]
        if any("[[crash]]" in t for t in texts):
            os.kill(os.getpid(), signal.SIGKILL)
        if any("[[stall]]" in t for t in texts):
            time.sleep(self.stall_s)
        if any("[[raise]]" in t for t in texts):
            time.sleep(self.batch_time_s)
            raise RuntimeError("faulty backend: a [[raise]] marker was in the batch")
        results = super().run(items, on_result)
        return [
            ItemResult(
                request_id=r.request_id,
                error_code="model_error",
                error_message="faulty backend: [[item-error]] marker",
            )
            if "[[item-error]]" in t
            else r
            for r, t in zip(results, texts, strict=True)
        ]
