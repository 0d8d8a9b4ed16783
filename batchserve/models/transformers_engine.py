"""The ``transformers`` engine: continuous batching of a causal LM, each request its own settings.

One thread steps the engine. A step admits waiting sequences that fit (rows and KV budget),
runs one chunk of prefill for sequences still reading their prompt, then one decode step for
every sequence that is generating, and reports what each produced. A sequence that finishes
(end-of-sequence, a stop string, its ``max_tokens``, or an abort) leaves at once and frees its
row for the next one: nobody waits for the longest generation of a batch.

Measured on the 2-core bench machine, SmolLM2-135M, 64 chat prompts of 34-504 tokens, 64 new
tokens each (``batchserve bench --scenario model``; docs/models.md): transformers' own
continuous batching (``generate_batch``, paged attention) ran at 23 tokens/s, the static batch
loop this replaced at 38, this engine at the figure in the docs. Prefill is chunked
(``max_prefill_tokens`` a step), so a long prompt delays the decoding sequences by one chunk at
a time, not by its whole prefill; the chunks of several prompts are packed into one forward
with no padding (``models.kv_rows``), so a step costs what its tokens cost.

Every file is local: nothing is ever downloaded.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

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
from batchserve.models.formats import grammar_of
from batchserve.models.hf import (
    cpu_threads,
    dtype_for,
    encode_prompt,
    ensure_converted,
    eos_ids,
    load_tokenizer,
)
from batchserve.models.kv_rows import ROW_ATTENTION, RowCache, Segment
from batchserve.models.registry import ModelSpec
from batchserve.models.sampling import (
    Shaping,
    allow_only,
    sample_token,
    seeded_generator,
    shape_logits,
)
from batchserve.models.scheduling import common_prefix, prefill_chunks, round_up
from batchserve.models.textstream import TextStream

log = get_logger("batchserve.engine")

# A shared prefix shorter than this is computed again: copying it costs about as much.
_MIN_SHARED_PREFIX = 16
# Rows are allocated in groups and columns in blocks, so the cache is resized rarely.
_ROW_GROUP = 4
_COLUMN_BLOCK = 64


@dataclass(eq=False)
class _Sequence:
    request: SequenceRequest
    prompt_ids: list[int]
    stream: TextStream
    generator: torch.Generator | None
    slot: int = -1
    prefilled: int = 0  # prompt tokens in the cache
    generated: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    shaping: Shaping = field(default_factory=Shaping)
    # The request's response_format as an llguidance matcher: which tokens may come next.
    matcher: Any = None

    @property
    def plain(self) -> bool:
        """Whether its next token is the logits' own choice (no processing, greedy)."""
        return self.matcher is None and not self.shaping.active and self.request.temperature <= 0

    @property
    def reserve(self) -> int:
        """Columns the sequence may ever occupy."""
        return len(self.prompt_ids) + self.request.max_tokens

    @property
    def decoding(self) -> bool:
        return self.prefilled == len(self.prompt_ids)

    @property
    def write_at(self) -> int:
        """The column its next decode step writes (its last token, not yet in the cache)."""
        return len(self.prompt_ids) + len(self.generated) - 1


class TransformersEngine(Engine):
    """A causal language model from local files, serving up to ``max_num_seqs`` sequences.

    Options (registry): ``dtype`` (``auto``: bfloat16 where the device computes it natively,
    float32 otherwise), ``max_num_seqs`` (32), ``kv_cache_gb`` (2), ``max_prefill_tokens``
    (512 a step), ``num_threads``.
    """

    def __init__(self, spec: ModelSpec, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self._clock = clock
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(spec))
        path = ensure_converted(spec)
        started = time.perf_counter()
        self.tokenizer = load_tokenizer(spec)
        self.dtype = dtype_for(spec, self.device)
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(
            path, dtype=self.dtype, local_files_only=True, attn_implementation=ROW_ATTENTION
        )
        self.model: Any = model.to(self.device).eval()
        config = self.model.config
        config_length = int(getattr(config, "max_position_embeddings", 0) or 0)
        self.context_length = min(spec.context_length, config_length or spec.context_length)
        self.eos_ids = eos_ids(self.model, self.tokenizer)
        self.max_num_seqs = int(spec.options.get("max_num_seqs", 32))
        self.max_prefill_tokens = int(spec.options.get("max_prefill_tokens", 512))
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.cache = RowCache(
            num_layers=int(config.num_hidden_layers),
            num_kv_heads=heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
            max_rows=self.max_num_seqs,
        )
        self.kv_budget_tokens = int(
            float(spec.options.get("kv_cache_gb", 2)) * 2**30 // self.cache.bytes_per_token
        )
        self.capacity = EngineCapacity(self.max_num_seqs, self.kv_budget_tokens)
        self._inbox: queue.SimpleQueue[SequenceRequest | str] = queue.SimpleQueue()
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._rows: list[_Sequence] = []  # by slot: decoding rows first, then prefilling
        self._num_decoding = 0
        self._by_id: dict[str, _Sequence] = {}
        self._aborted: set[str] = set()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._emit: OnUpdates = lambda updates: None
        self._ll_tokenizer: Any = None
        self.steps = 0
        self.shared_prefix_tokens = 0  # prompt tokens copied from another sequence's cache
        self.last_step_at = clock()
        self.load_seconds = time.perf_counter() - started
        log.info(
            "engine_loaded",
            model=spec.name,
            device=self.device,
            dtype=str(self.dtype).removeprefix("torch."),
            seconds=round(self.load_seconds, 2),
            max_num_seqs=self.max_num_seqs,
            kv_budget_tokens=self.kv_budget_tokens,
        )

    # -- the contract ------------------------------------------------------------------------

    async def start(self, on_updates: OnUpdates) -> None:
        loop = asyncio.get_running_loop()
        if self.profile is None:
            self.profile = await asyncio.to_thread(self.measure)

        def emit(updates: Sequence[SequenceUpdate]) -> None:
            loop.call_soon_threadsafe(on_updates, updates)

        self._emit = emit
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def add(self, request: SequenceRequest) -> None:
        if not self._rows and not self._waiting and self._inbox.empty():
            # An idle engine is not a stalled one: its stall clock starts with its work, not
            # with its last step before it went idle (minutes ago, maybe).
            self.last_step_at = self._clock()
        self._inbox.put(request)
        self._wake.set()

    def abort(self, request_id: str) -> None:
        self._inbox.put(request_id)
        self._wake.set()

    def health(self) -> EngineHealth:
        return EngineHealth(
            running=len(self._rows),
            waiting=len(self._waiting) + self._inbox.qsize(),
            steps=self.steps,
            last_step_at=self.last_step_at,
        )

    def count_tokens(self, input_text: str | None, messages: list[dict[str, Any]] | None) -> int:
        return len(encode_prompt(self.tokenizer, input_text, messages))

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30.0)

    # -- stepping ----------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while not self._closed:
                self._wake.clear()
                try:
                    updates = self.step()
                except Exception:  # the engine is broken: let the worker's watchdog see it
                    log.exception("engine_step_failed", model=self.spec.name)
                    return
                if updates:
                    self._emit(updates)
                if not self._rows and not updates:
                    self._wake.wait(0.5)

    def step(self) -> list[SequenceUpdate]:
        """One engine step; returns what it produced. Called by the engine thread (or a test)."""
        updates: list[SequenceUpdate] = []
        self._take_inbox(updates)
        self._admit(updates)
        if len(self._rows) > self._num_decoding:
            self._prefill(updates)
        if self._num_decoding:
            self._decode(updates)
        worked = bool(self._rows)
        self._retire()
        if worked or updates:
            self.steps += 1
            self.last_step_at = self._clock()
        return updates

    def _take_inbox(self, updates: list[SequenceUpdate]) -> None:
        while True:
            try:
                entry = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(entry, str):
                self._abort_now(entry, updates)
            else:
                self._receive(entry, updates)

    def _receive(self, request: SequenceRequest, updates: list[SequenceUpdate]) -> None:
        if request.request_id in self._by_id:
            return  # already running here (a duplicate delivery)
        try:
            prompt_ids = encode_prompt(self.tokenizer, request.input, request.messages)
        except Exception as error:  # e.g. a chat template that rejects these messages
            updates.append(failed_update(request, ErrorCode.MODEL_ERROR, f"bad prompt: {error}", 0))
            return
        if not prompt_ids:  # the model needs at least one position to predict from
            prompt_ids = [int(self.tokenizer.bos_token_id or self.tokenizer.pad_token_id or 0)]
        need = len(prompt_ids) + request.max_tokens
        limit = min(self.context_length, self.kv_budget_tokens)
        if need > limit:
            message = (
                f"the prompt has {len(prompt_ids)} tokens and max_tokens is "
                f"{request.max_tokens}: together more than the {limit} tokens "
                f"{self.spec.name} can hold for one sequence"
            )
            code = ErrorCode.CONTEXT_LENGTH_EXCEEDED
            updates.append(failed_update(request, code, message, len(prompt_ids)))
            return
        vocabulary = int(self.model.config.vocab_size)
        beyond = [token for token, _ in request.logit_bias if not 0 <= token < vocabulary]
        if beyond:
            message = f"logit_bias names token {beyond[0]}; {self.spec.name} has {vocabulary}"
            updates.append(failed_update(request, ErrorCode.MODEL_ERROR, message, len(prompt_ids)))
            return
        try:
            matcher = self._matcher(request.response_format)
        except ValueError as error:
            message = f"response_format: {error}"
            updates.append(failed_update(request, ErrorCode.MODEL_ERROR, message, len(prompt_ids)))
            return
        sequence = _Sequence(
            request=request,
            prompt_ids=prompt_ids,
            stream=TextStream(self._decode_step_fn(), request.stop),
            generator=seeded_generator(request.temperature, request.seed, self.device),
            shaping=Shaping(
                presence_penalty=request.presence_penalty,
                frequency_penalty=request.frequency_penalty,
                repetition_penalty=request.repetition_penalty,
                logit_bias=request.logit_bias,
                min_tokens=request.min_tokens,
            ),
            matcher=matcher,
        )
        self._waiting.append(sequence)
        self._by_id[request.request_id] = sequence

    def _matcher(self, response_format: dict[str, Any] | None) -> Any:
        """An llguidance matcher of the format's grammar (``None`` for plain text). The
        tokenizer it needs is built once, by the first request that asks for a format."""
        grammar = grammar_of(response_format)
        if grammar is None:
            return None
        from llguidance import LLMatcher

        if self._ll_tokenizer is None:
            from llguidance.hf import from_tokenizer

            self._ll_tokenizer = from_tokenizer(
                self.tokenizer, n_vocab=int(self.model.config.vocab_size)
            )
        matcher = LLMatcher(self._ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def _abort_now(self, request_id: str, updates: list[SequenceUpdate]) -> None:
        sequence = self._by_id.get(request_id)
        if sequence is None or sequence.finish_reason is not None:
            return
        sequence.finish_reason = "cancelled"
        updates.append(self._update(sequence))
        if sequence in self._waiting:
            self._waiting.remove(sequence)
            del self._by_id[request_id]

    # -- admission ---------------------------------------------------------------------------

    def _admit(self, updates: list[SequenceUpdate]) -> None:
        """Give waiting sequences rows, oldest first, while rows and the KV budget allow."""
        # Every row is as long as the longest reservation: the cache is rows x columns. The
        # cache grows once for everything admitted this step (each resize copies it).
        rows = len(self._rows)
        columns = max([s.reserve for s in self._rows], default=0)
        admitted: list[_Sequence] = []
        while len(self._waiting) > len(admitted) and rows < self.max_num_seqs:
            sequence = self._waiting[len(admitted)]
            wider = max(columns, sequence.reserve)
            if (rows + 1) * wider > self.kv_budget_tokens:
                break  # oldest first: it waits for room rather than be overtaken forever
            admitted.append(sequence)
            rows, columns = rows + 1, wider
        if not admitted:
            return
        self._grow(rows, columns)
        for sequence in admitted:
            self._waiting.popleft()
            sequence.slot = len(self._rows)
            self._share_prefix(sequence)
            self._rows.append(sequence)

    def _ready_to_prefill(self) -> list[_Sequence]:
        """The prefilling rows that take part in this step. A row that has not started and
        shares a prefix with another that has not either sits this step out: the other computes
        the prefix, and it copies it at the next (a burst of chat prompts computes its template
        once, not once a prompt)."""
        ready: list[_Sequence] = []
        leaders: list[_Sequence] = []
        for sequence in self._rows[self._num_decoding :]:
            if sequence.prefilled == 0:
                self._share_prefix(sequence)
            if sequence.prefilled == 0:
                shares = [common_prefix(sequence.prompt_ids, lead.prompt_ids) for lead in leaders]
                if any(shared >= _MIN_SHARED_PREFIX for shared in shares):
                    continue
                leaders.append(sequence)
            ready.append(sequence)
        return ready

    def _share_prefix(self, sequence: _Sequence) -> None:
        """Start a new sequence's prefill after the longest prefix of its prompt that a running
        sequence already holds (a chat template, a system prompt): its keys and values are
        copied, not computed again. The last prompt token is always computed (its logits are the
        first token's)."""
        prompt = sequence.prompt_ids
        best, donor = 0, None
        for row in self._rows:
            cached = min(row.prefilled, len(row.prompt_ids))
            limit = min(cached, len(prompt) - 1)
            if limit <= best or row is sequence:
                continue
            shared = min(common_prefix(row.prompt_ids, sequence.prompt_ids), limit)
            if shared > best:
                best, donor = shared, row
        if donor is not None and best >= _MIN_SHARED_PREFIX:
            self.cache.copy_prefix(donor.slot, sequence.slot, best)
            sequence.prefilled = best
            self.shared_prefix_tokens += best

    def _grow(self, rows: int, columns: int) -> None:
        """Make room for ``rows`` x ``columns``, rounded up where the budget allows so that the
        cache is resized rarely."""
        cache = self.cache
        if rows <= cache.rows and columns <= cache.columns:
            return
        columns = max(cache.columns, columns)
        padded_columns = round_up(columns, _COLUMN_BLOCK)
        if rows * padded_columns <= self.kv_budget_tokens:
            columns = padded_columns
        rows = max(cache.rows, rows)
        # Rows at least double: sequences arriving one at a time resize it log(n) times.
        padded_rows = min(self.max_num_seqs, max(round_up(rows, _ROW_GROUP), 2 * cache.rows))
        if padded_rows * columns <= self.kv_budget_tokens:
            rows = padded_rows
        cache.resize(rows, columns)

    # -- forwards ----------------------------------------------------------------------------

    def _prefill(self, updates: list[SequenceUpdate]) -> None:
        """One chunk of prompt for the oldest prefilling rows, ``max_prefill_tokens`` in all,
        packed into one forward."""
        prefilling = self._ready_to_prefill()
        remaining = [len(s.prompt_ids) - s.prefilled for s in prefilling]
        chunks = prefill_chunks(remaining, self.max_prefill_tokens)
        ids: list[int] = []
        positions: list[int] = []
        segments: list[Segment] = []
        for sequence, chunk in zip(prefilling, chunks, strict=False):
            begin = sequence.prefilled
            segments.append(Segment(sequence.slot, begin, chunk, len(ids)))
            ids += sequence.prompt_ids[begin : begin + chunk]
            positions += range(begin, begin + chunk)
        ending = [
            i for i, s in enumerate(segments) if s.end == len(prefilling[i].prompt_ids)
        ]  # these computed their last prompt token: its logits give the first new token
        keep = [segments[i].offset + segments[i].width - 1 for i in ending]
        device = self.device
        self.cache.plan_prefill(segments)
        out = self.model(
            input_ids=torch.tensor([ids], device=device),
            position_ids=torch.tensor([positions], device=device),
            cache=self.cache,
            use_cache=True,
            logits_to_keep=torch.tensor(keep or [0], device=device),
            row_segments=segments,
        )
        for sequence, segment in zip(prefilling, segments, strict=False):
            sequence.prefilled = segment.end
        if ending:
            self._push([prefilling[i] for i in ending], out.logits[0, : len(ending)], updates)

    def _decode(self, updates: list[SequenceUpdate]) -> None:
        """One token for every decoding row."""
        rows = self._rows[: self._num_decoding]
        device = self.device
        write_at = torch.tensor([s.write_at for s in rows], device=device)
        read = int(write_at.max()) + 1
        visible = torch.arange(read, device=device)[None, :] <= write_at[:, None]
        self.cache.plan_decode(len(rows), write_at, read)
        out = self.model(
            input_ids=torch.tensor([[s.generated[-1]] for s in rows], device=device),
            attention_mask=visible[:, None, None, :],
            position_ids=write_at[:, None],
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self._push(rows, out.logits[:, -1, :], updates)

    def _push(
        self, sequences: Sequence[_Sequence], logits: torch.Tensor, updates: list[SequenceUpdate]
    ) -> None:
        """Pick each sequence's next token (its request's processing first: penalties, bias,
        minimum length, its format's grammar), and see whether that ends it."""
        tokens = logits.argmax(dim=-1)
        for i, sequence in enumerate(sequences):
            if not sequence.plain:
                tokens[i] = self._choose(sequence, logits[i])
        for sequence, token_id in zip(sequences, tokens.tolist(), strict=True):
            if sequence.finish_reason is not None:
                continue  # aborted this step: its token is dropped
            sequence.generated.append(token_id)
            matcher = sequence.matcher
            if matcher is not None and token_id not in self.eos_ids:
                matcher.consume_token(token_id)
            if token_id in self.eos_ids and not sequence.request.ignore_eos:
                sequence.finish_reason = "stop"  # counted as generated, never shown
            else:
                sequence.stream.push(token_id)
                if sequence.stream.stopped or (matcher is not None and matcher.is_stopped()):
                    sequence.finish_reason = "stop"  # a stop string, or the format is complete
                elif len(sequence.generated) >= sequence.request.max_tokens:
                    sequence.finish_reason = "length"
            updates.append(self._update(sequence))

    def _choose(self, sequence: _Sequence, logits: torch.Tensor) -> int:
        request = sequence.request
        row = logits.float().clone()
        if sequence.shaping.active:
            shape_logits(
                row, sequence.shaping, sequence.prompt_ids, sequence.generated, self.eos_ids
            )
        if sequence.matcher is not None:
            allow_only(row, sequence.matcher.compute_bitmask())
        if request.temperature <= 0:
            return int(row.argmax())
        token = sample_token(
            row,
            request.temperature,
            request.top_p,
            sequence.generator,
            top_k=request.top_k,
            min_p=request.min_p,
        )
        return int(token)

    def _update(self, sequence: _Sequence) -> SequenceUpdate:
        stream = sequence.stream
        text = stream.rest() if sequence.finish_reason is not None else stream.take()
        return SequenceUpdate(
            request_id=sequence.request.request_id,
            text=text,
            completion_tokens=len(sequence.generated),
            prompt_tokens=len(sequence.prompt_ids),
            finish_reason=sequence.finish_reason,
        )

    # -- rows --------------------------------------------------------------------------------

    def _retire(self) -> None:
        """Free the rows of finished sequences and move rows that finished prefill into the
        decoding block, keeping both blocks contiguous."""
        for sequence in [s for s in self._rows if s.finish_reason is not None]:
            self._release(sequence)
            del self._by_id[sequence.request.request_id]
        for sequence in [s for s in self._rows[self._num_decoding :] if s.decoding]:
            self._swap(sequence.slot, self._num_decoding)
            self._num_decoding += 1
        self._shrink()

    def _release(self, sequence: _Sequence) -> None:
        slot = sequence.slot
        if slot < self._num_decoding:
            last_decoding = self._num_decoding - 1
            self._move(last_decoding, slot)
            self._num_decoding -= 1
            slot = last_decoding
        self._move(len(self._rows) - 1, slot)
        self._rows.pop()

    def _move(self, source: int, target: int) -> None:
        if source == target:
            return
        sequence = self._rows[source]
        self.cache.move_row(source, target, _cached_length(sequence))
        sequence.slot = target
        self._rows[target] = sequence

    def _swap(self, a: int, b: int) -> None:
        if a == b:
            return
        first, second = self._rows[a], self._rows[b]
        length = max(_cached_length(first), _cached_length(second))
        self.cache.swap_rows(a, b, length)
        first.slot, second.slot = b, a
        self._rows[a], self._rows[b] = second, first

    def _shrink(self) -> None:
        """Give memory back once the cache is much larger than what is running needs."""
        cache = self.cache
        rows = round_up(max(1, len(self._rows)), _ROW_GROUP)
        columns = round_up(max([s.reserve for s in self._rows], default=1), _COLUMN_BLOCK)
        if rows * 2 <= cache.rows or columns * 2 <= cache.columns:
            cache.resize(min(cache.rows, rows), min(cache.columns, columns))

    # -- helpers -----------------------------------------------------------------------------

    def _decode_step_fn(self) -> Callable[[int], str | None]:
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=True)
        backend = self.tokenizer.backend_tokenizer
        return lambda token_id: stream.step(backend, token_id)

    def measure(self) -> EngineProfile:
        """Time a prefill and decode steps alone and with every row busy, with synthetic
        prompts that never reach a caller, after a short run that warms the kernels up (timed
        first, the lone steps paid for it: on a busy machine they came out slower than full
        ones)."""
        sink: list[SequenceUpdate] = []
        prompts = warmup_prompts(self.max_num_seqs)
        with torch.inference_mode():
            self._timed_run(prompts[:1], max_tokens=2, sink=sink)
            alone = self._timed_run(prompts[:1], max_tokens=6, sink=sink)
            full = self._timed_run(prompts, max_tokens=6, sink=sink)
        profile = EngineProfile(
            prefill_tokens_per_s=full[0],
            decode_step_s=full[1],
            decode_step_s_alone=alone[1],
        )
        log.info(
            "engine_profile",
            model=self.spec.name,
            prefill_tokens_per_s=round(profile.prefill_tokens_per_s),
            decode_step_ms=round(profile.decode_step_s * 1000, 1),
            decode_step_ms_alone=round(profile.decode_step_s_alone * 1000, 1),
        )
        return profile

    def _timed_run(
        self, prompts: list[str], max_tokens: int, sink: list[SequenceUpdate]
    ) -> tuple[float, float]:
        """(prefill tokens/s, seconds a decode step) over a run of these prompts."""
        for n, prompt in enumerate(prompts):
            self._receive(
                SequenceRequest(f"__warmup-{n}", prompt, None, max_tokens, 0.0, ignore_eos=True),
                sink,
            )
        prompt_tokens = sum(len(s.prompt_ids) for s in self._waiting)
        started = time.perf_counter()
        while any(not s.decoding for s in [*self._waiting, *self._rows]):
            self.step()
        prefill_s = time.perf_counter() - started
        step_s: list[float] = []
        while self._rows:
            started = time.perf_counter()
            self.step()
            step_s.append(time.perf_counter() - started)
        # The median step: one step stalled by another process does not make the engine slow.
        decode_s = statistics.median(step_s) if step_s else 0.0
        return prompt_tokens / max(prefill_s, 1e-6), decode_s


def _cached_length(sequence: _Sequence) -> int:
    return sequence.prefilled + max(0, len(sequence.generated) - 1)
