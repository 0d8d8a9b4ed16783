"""Engine backends: one long-lived engine per device, holding many sequences at once.

A batch backend runs a batch as a unit (the seeds' model). An engine instead takes sequences one
by one, at any time: a new sequence joins the running ones at the next decode-step boundary, and
each leaves the moment it finishes, so a short answer never waits for a long one. The worker
feeds it the requests of every batch the batcher sends (see
``batchserve/workers/engine_runner.py``); the engine reports what each step produced through
one callback.

This module holds the engine's contract and the values that cross it. It imports no torch: the
batcher, the API and the tests read these types without loading a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.core.domain import BatchItem, ErrorCode


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """One request as an engine runs it: the prompt and how to continue it."""

    request_id: str
    input: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    # OpenAI's response_format: {"type": "json_object"} or {"type": "json_schema", ...}.
    response_format: dict[str, Any] | None = None

    @classmethod
    def of(cls, item: BatchItem, max_new_tokens: int) -> SequenceRequest:
        """The request a batch item asks for; ``max_tokens`` bounded by the model's limit."""
        params = item.params
        stop = params.get("stop") or ()
        temperature = params.get("temperature")  # absent means the API's default, 1.0
        bias = params.get("logit_bias") or {}
        return cls(
            request_id=item.request_id,
            input=item.input,
            messages=item.messages,
            max_tokens=max(1, min(int(params.get("max_tokens") or max_new_tokens), max_new_tokens)),
            temperature=1.0 if temperature is None else float(temperature),
            top_p=float(params.get("top_p") or 1.0),
            stop=(stop,) if isinstance(stop, str) else tuple(s for s in stop if s),
            seed=None if params.get("seed") is None else int(params["seed"]),
            ignore_eos=bool(params.get("ignore_eos", False)),
            top_k=int(params.get("top_k") or 0),
            min_p=float(params.get("min_p") or 0.0),
            presence_penalty=float(params.get("presence_penalty") or 0.0),
            frequency_penalty=float(params.get("frequency_penalty") or 0.0),
            repetition_penalty=float(params.get("repetition_penalty") or 1.0),
            logit_bias=tuple(sorted((int(k), float(v)) for k, v in bias.items())),
            min_tokens=int(params.get("min_tokens") or 0),
            response_format=params.get("response_format"),
        )


@dataclass(frozen=True, slots=True)
class SequenceUpdate:
    """What one engine step produced for one sequence.

    ``text`` is the text new since the sequence's previous update, safe to show: a stop string
    is never split across updates, and once found it is cut off. The last update of a sequence
    has a ``finish_reason`` (``stop``, ``length`` or ``cancelled``) or an error of its own (a
    prompt the model cannot take); the engine forgets the sequence after it.
    """

    request_id: str
    text: str
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None = None
    error_code: str | None = None
    error_message: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.error_code is not None


@dataclass(frozen=True, slots=True)
class EngineCapacity:
    """What an engine can hold at once: sequences, and tokens of KV cache (prompt plus
    generated) summed over them. The batcher never sends more than this."""

    max_num_seqs: int
    max_num_tokens: int

    def encode(self) -> str:
        return f"{self.max_num_seqs}/{self.max_num_tokens}"

    @classmethod
    def decode(cls, text: str) -> EngineCapacity:
        seqs, _, tokens = text.partition("/")
        return cls(int(seqs), int(tokens) if tokens else 1 << 40)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """The engine's speed, measured when it starts: the prior of the learned sequence time and
    what ``batchserve capacity --model`` plans with before any request has run."""

    prefill_tokens_per_s: float
    decode_step_s: float  # one decode step with ``max_num_seqs`` sequences running
    decode_step_s_alone: float  # one decode step with a single sequence

    def sequence_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """A sequence's time in a full engine: its prefill, then one full step a token."""
        return prompt_tokens / self.prefill_tokens_per_s + max_tokens * self.decode_step_s

    def tokens_per_s(self, max_num_seqs: int) -> float:
        """Generated tokens a second with every sequence slot busy decoding."""
        return max_num_seqs / self.decode_step_s


@dataclass(frozen=True, slots=True)
class EngineHealth:
    running: int  # sequences admitted (prefilling or decoding)
    waiting: int  # sequences received, waiting for room
    steps: int
    last_step_at: float  # monotonic seconds of the last finished step


OnUpdates = Callable[[Sequence[SequenceUpdate]], None]


def failed_update(
    request: SequenceRequest, code: ErrorCode, message: str, prompt_tokens: int
) -> SequenceUpdate:
    """The last word on a sequence the engine cannot run (a bad or too long prompt)."""
    return SequenceUpdate(
        request_id=request.request_id,
        text="",
        completion_tokens=0,
        prompt_tokens=prompt_tokens,
        error_code=code.value,
        error_message=message,
    )


def warmup_prompts(count: int) -> list[str]:
    """Synthetic prompts of about 90 tokens, each a little different, that an engine measures
    its speed with when it starts (they never reach a caller)."""
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"] * 8
    return [" ".join([*words[n % 10 :], str(n)]) for n in range(count)]


class Engine(ABC):
    """A loaded model that serves many sequences at once.

    ``start``, ``add`` and ``abort`` are called on one event loop, and ``on_updates`` is called
    on that loop too (once a step, with every sequence the step advanced). ``abort`` ends a
    sequence at the next step boundary with ``finish_reason="cancelled"``; aborting one the
    engine no longer holds does nothing.
    """

    capacity: EngineCapacity
    profile: EngineProfile | None = None

    @abstractmethod
    async def start(self, on_updates: OnUpdates) -> None: ...

    @abstractmethod
    def add(self, request: SequenceRequest) -> None: ...

    @abstractmethod
    def abort(self, request_id: str) -> None: ...

    @abstractmethod
    def health(self) -> EngineHealth: ...

    async def close(self) -> None:
        return None
