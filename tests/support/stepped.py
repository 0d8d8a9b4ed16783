"""Roles stepped in-process with a fake clock: an engine twin and the embedded store.

``ScriptedEngine`` behaves like an engine (sequences join, take one token a step, leave when
done or aborted, never more than its capacity at once) with words of the prompt for tokens, so
a test can step the engine runner and the batcher deterministically, with no model and no
sleeps. The integration and end-to-end tiers run the real engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from prometheus_client import REGISTRY

from batchserve.core.db import create_engine
from batchserve.core.domain import Lane, SubmitCommand, from_epoch
from batchserve.core.ids import uuid7
from batchserve.core.migrate import upgrade
from batchserve.core.store import Admission, JobStore, OnChange
from batchserve.models.engine import (
    Engine,
    EngineCapacity,
    EngineHealth,
    EngineProfile,
    OnUpdates,
    SequenceRequest,
    SequenceUpdate,
)
from batchserve.models.textstream import TextStream


@dataclass
class Clock:
    """A clock the test moves: ``clock()`` reads it."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class _Running:
    request: SequenceRequest
    words: list[str]
    stream: TextStream
    generated: int = 0


@dataclass
class ScriptedEngine(Engine):
    """An engine twin stepped by the test: see the module docstring."""

    max_num_seqs: int = 4
    max_num_tokens: int = 100_000
    clock: Clock = field(default_factory=Clock)
    inbox: list[SequenceRequest] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    running: dict[str, _Running] = field(default_factory=dict)
    steps: int = 0
    hung: bool = False  # a hung engine makes no step
    stuck: set[str] = field(default_factory=set)  # sequences that make no token, though it steps
    added: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.capacity = EngineCapacity(self.max_num_seqs, self.max_num_tokens)
        self.profile = EngineProfile(
            prefill_tokens_per_s=1000.0, decode_step_s=0.05, decode_step_s_alone=0.02
        )
        self._on_updates: OnUpdates = lambda updates: None
        self.last_step_at = self.clock()

    async def start(self, on_updates: OnUpdates) -> None:
        self._on_updates = on_updates

    def add(self, request: SequenceRequest) -> None:
        self.inbox.append(request)
        self.added.append(request.request_id)

    def abort(self, request_id: str) -> None:
        self.aborts.append(request_id)

    def health(self) -> EngineHealth:
        return EngineHealth(len(self.running), len(self.inbox), self.steps, self.last_step_at)

    def step(self) -> list[SequenceUpdate]:
        if self.hung:
            return []
        updates: list[SequenceUpdate] = []
        for request_id in self.aborts:
            gone = self.running.pop(request_id, None)
            if gone is not None:
                updates.append(self._update(gone, "cancelled"))
        self.aborts = []
        while self.inbox and len(self.running) < self.max_num_seqs:
            request = self.inbox.pop(0)
            text = request.input or " ".join(str(m["content"]) for m in request.messages or [])
            words = text.split() or ["."]
            stream = TextStream(_word_of(words), request.stop)
            self.running[request.request_id] = _Running(request, words, stream)
        for request_id, sequence in list(self.running.items()):
            if request_id in self.stuck:
                continue
            sequence.stream.push(sequence.generated)
            sequence.generated += 1
            reason = None
            if sequence.stream.stopped:
                reason = "stop"
            elif sequence.generated >= sequence.request.max_tokens:
                reason = "length"
            if reason is not None:
                del self.running[request_id]
            updates.append(self._update(sequence, reason))
        self.steps += 1
        self.last_step_at = self.clock()
        self._on_updates(updates)
        return updates

    def _update(self, sequence: _Running, reason: str | None) -> SequenceUpdate:
        stream = sequence.stream
        return SequenceUpdate(
            request_id=sequence.request.request_id,
            text=stream.rest() if reason else stream.take(),
            completion_tokens=sequence.generated,
            prompt_tokens=len(sequence.words),
            finish_reason=reason,
        )


def _word_of(words: list[str]) -> Callable[[int], str | None]:
    """Token n is the n-th word of the prompt, round and round."""
    return lambda n: f" {words[n % len(words)]}"


def sqlite_store(
    tmp_path: Path, *, max_failures: int = 3, on_change: OnChange | None = None
) -> JobStore:
    """The embedded store on a fresh SQLite file, reporting its changes to ``on_change``."""
    url = f"sqlite+aiosqlite:///{tmp_path}/stepped.sqlite3"
    upgrade(url)
    engine = create_engine(url, pool_size=2)
    return JobStore(engine, max_failures=max_failures, on_change=on_change)


async def submit(
    store: JobStore,
    texts: Sequence[str],
    *,
    model: str = "engine",
    now: float,
    max_tokens: int | Sequence[int] = 4,
    timeout_s: float = 600.0,
) -> list[str]:
    """Requests of ``texts`` (one each), committed as the API would; returns their ids."""
    limits = [max_tokens] * len(texts) if isinstance(max_tokens, int) else list(max_tokens)
    commands = [
        command(text, model=model, now=now, max_tokens=limit, timeout_s=timeout_s)
        for text, limit in zip(texts, limits, strict=True)
    ]
    outcomes = await store.submit(commands)
    return [str(o.record.id) for o in outcomes if isinstance(o, Admission)]


def command(
    text: str,
    *,
    model: str = "engine",
    now: float,
    max_tokens: int = 4,
    timeout_s: float = 600.0,
    job_id: uuid.UUID | None = None,
) -> SubmitCommand:
    """A request of ``text`` created ``now``; of bulk job ``job_id`` when given."""
    created = from_epoch(now)
    return SubmitCommand(
        id=uuid7(),
        tenant="t1",
        model=model,
        lane=Lane.INTERACTIVE,
        input=text,
        messages=None,
        params={"max_tokens": max_tokens, "temperature": 0.0},
        created_at=created,
        deadline=created + timedelta(seconds=timeout_s),
        prompt_tokens=len(text.split()),
        max_tokens=max_tokens,
        job_id=job_id,
    )


def store_seconds(model: str) -> tuple[float, float]:
    """``batchserve_results_store_seconds`` of ``model`` so far in this process: its count and
    its sum."""
    count, total = (
        REGISTRY.get_sample_value(f"batchserve_results_store_seconds_{part}", {"model": model})
        for part in ("count", "sum")
    )
    return (count or 0.0, total or 0.0)
