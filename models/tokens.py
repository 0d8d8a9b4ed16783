"""Prompt token counts at admission: exact where the model has a tokenizer, else estimated.

The API checks a prompt against the model's context before accepting it, so a request that can
never run is refused at once (422 ``context_length_exceeded``) rather than failed by a worker.
Tokenizers load in the background at start-up; until one is ready, counts are estimated.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from models.registry import ModelSpec, Registry

log = logging.getLogger("batchserve.tokens")

# Prompts longer than this are counted off the event loop.
_LONG_PROMPT_CHARS = 20_000


def estimate_tokens(input_text: str | None, messages: list[dict[str, Any]] | None) -> int:
    """About four characters a token, plus a little per chat message."""
    if messages is not None:
        chars = sum(len(str(m.get("content") or "")) + 16 for m in messages)
    else:
        chars = len(input_text or "")
    return max(1, chars // 4)


class PromptCounter:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._tokenizers: dict[str, Any] = {}

    def prewarm(self) -> None:
        """Load the tokenizers of real models in a background thread."""
        specs = [s for s in self._registry.specs() if s.backend == "transformers"]
        if specs:
            threading.Thread(target=self._load_all, args=(specs,), daemon=True).start()

    def _load_all(self, specs: list[ModelSpec]) -> None:
        for spec in specs:
            try:
                from models.transformers_backend import load_tokenizer

                self._tokenizers[spec.name] = load_tokenizer(spec)
                log.info("tokenizer_ready model=%s", spec.name)
            except Exception:  # admission falls back to estimates; the worker will say more
                log.exception("tokenizer_unavailable model=%s", spec.name)

    def exact(self, model: str) -> bool:
        return model in self._tokenizers

    async def count(
        self, spec: ModelSpec, input_text: str | None, messages: list[dict[str, Any]] | None
    ) -> int:
        tokenizer = self._tokenizers.get(spec.name)
        if tokenizer is None:
            return estimate_tokens(input_text, messages)
        from models.transformers_backend import encode_prompt

        size = len(input_text or "") + sum(len(str(m.get("content") or "")) for m in messages or [])
        if size > _LONG_PROMPT_CHARS:
            return len(await asyncio.to_thread(encode_prompt, tokenizer, input_text, messages))
        return len(encode_prompt(tokenizer, input_text, messages))
