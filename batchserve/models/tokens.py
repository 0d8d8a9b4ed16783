"""Prompt token counts at admission: exact where the model has a tokenizer, else estimated.

The API checks a prompt against the model's context before accepting it, so a request that can
never run is refused at once (422 ``context_length_exceeded``) rather than failed by a worker.
Tokenizers load in the background at start-up, from the model's tokenizer files alone (no torch,
no transformers: ``batchserve/models/tokenizer_files.py``); until one is ready, counts are
estimated.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from batchserve.core.logs import get_logger
from batchserve.models.plugins import plugin_for
from batchserve.models.registry import ModelSpec, Registry
from batchserve.models.tokenizer_files import FileTokenizer, file_tokenizer

log = get_logger("batchserve.tokens")

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
        self._tokenizers: dict[str, FileTokenizer] = {}
        self._stopping = threading.Event()
        self._loader: threading.Thread | None = None

    def prewarm(self, retry_s: float = 10.0) -> None:
        """Load the tokenizers of real models in a background thread: those whose files are on
        disk now, and the others as soon as a worker has put them there (the API never
        converts a model itself)."""
        specs = [s for s in self._registry.specs() if plugin_for(s).tokenizer_dir is not None]
        if specs:
            self._stopping.clear()
            self._loader = threading.Thread(
                target=self._load_all, args=(specs, retry_s), daemon=True
            )
            self._loader.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop looking for tokenizers; wait a little for a load under way (a thread that
        outlives its process's logging fails writing to a closed stream)."""
        self._stopping.set()
        if self._loader is not None:
            self._loader.join(timeout_s)
            self._loader = None

    def _load_all(self, specs: list[ModelSpec], retry_s: float) -> None:
        waiting = list(specs)
        while waiting and not self._stopping.is_set():
            for spec in list(waiting):
                finder = plugin_for(spec).tokenizer_dir
                path = finder(spec) if finder is not None else None
                if path is None:
                    continue
                waiting.remove(spec)
                try:
                    tokenizer = file_tokenizer(path)
                except Exception:  # admission falls back to estimates; the worker says more
                    if not self._stopping.is_set():
                        log.exception("tokenizer_unavailable", model=spec.name)
                    continue
                if self._stopping.is_set():  # stop() gave up waiting: its logs may be closed
                    return
                self._tokenizers[spec.name] = tokenizer
                log.info("tokenizer_ready", model=spec.name)
            if waiting:
                self._stopping.wait(retry_s)

    def exact(self, model: str) -> bool:
        return model in self._tokenizers

    async def count(
        self, spec: ModelSpec, input_text: str | None, messages: list[dict[str, Any]] | None
    ) -> int:
        tokenizer = self._tokenizers.get(spec.name)
        if tokenizer is None:
            return estimate_tokens(input_text, messages)
        size = len(input_text or "") + sum(len(str(m.get("content") or "")) for m in messages or [])
        if size > _LONG_PROMPT_CHARS:
            return len(await asyncio.to_thread(tokenizer.encode_prompt, input_text, messages))
        return len(tokenizer.encode_prompt(input_text, messages))

    async def count_texts(self, spec: ModelSpec, texts: list[str]) -> list[int] | None:
        """Each text's exact token count, or ``None`` while the model's tokenizer is not
        loaded (the worker then refuses a text too long for the model)."""
        tokenizer = self._tokenizers.get(spec.name)
        if tokenizer is None:
            return None
        if sum(len(t) for t in texts) > _LONG_PROMPT_CHARS:
            return await asyncio.to_thread(tokenizer.count_texts, texts)
        return tokenizer.count_texts(texts)
