"""The API's token counter loads tokenizers in a thread that must end with the API."""

from __future__ import annotations

import time

from batchserve.models.registry import parse_registry
from batchserve.models.tokens import PromptCounter

# A real model whose weights were never converted: its tokenizer is not on disk, so the loader
# keeps looking for it (every retry_s) until it is stopped.
NEVER_CONVERTED = """
[models.not-here]
backend = "transformers"
model_dir = "/nonexistent/batchserve-test-model"
"""


def test_stopping_ends_the_tokenizer_loader_at_once() -> None:
    counter = PromptCounter(parse_registry(NEVER_CONVERTED))
    counter.prewarm(retry_s=3600.0)
    loader = counter._loader
    assert loader is not None and loader.is_alive()
    started = time.monotonic()
    counter.stop()
    assert not loader.is_alive()
    assert time.monotonic() - started < 2.0  # not the hour it would have slept
    assert not counter.exact("not-here")
