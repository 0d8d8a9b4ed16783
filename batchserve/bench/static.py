"""The static batch loop the transformers backend ran before its engine: the model benchmark's
baseline ("today's"), kept to measure the engine against it in the same run.

``generate`` prefills a left-padded batch once, then steps all unfinished rows together through
the KV cache (a ``DynamicCache``, concatenated every step). Each row has its own
``max_new_tokens``, temperature (0 = greedy), top-p, seed and stop strings. A row that finishes
is dropped from the batch, cache included; the batch ends with its longest row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from batchserve.models.sampling import sample_token, seeded_generator

# Decodes generated token ids into text, special tokens left out.
DecodeFn = Callable[[Sequence[int]], str]
# Asked between steps with a row's request id: True drops the row as cancelled.
ShouldStop = Callable[[str], bool]
# Told, with its index, about each row the moment it finishes.
OnRowDone = Callable[[int, "RowOutput"], None]


@dataclass(frozen=True, slots=True)
class RowRequest:
    """One prompt, already tokenized, and how its continuation should be generated."""

    request_id: str
    prompt_ids: Sequence[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True, slots=True)
class RowOutput:
    """What one row generated: text with any stop string cut off, and the ids it cost."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop", "length" or "cancelled"


@dataclass(frozen=True, slots=True)
class BatchOutput:
    rows: list[RowOutput]
    padded_prompt_len: int
    steps: int  # forward passes: the prefill and every decode step after it


@dataclass(slots=True)
class _Row:
    """A row being decoded: the ids so far, and how (and whether) it finished."""

    request: RowRequest
    generator: torch.Generator | None
    token_ids: list[int] = field(default_factory=list)
    stop_at: int | None = None  # where the first stop string begins in the decoded text
    text: str | None = None
    finish_reason: str | None = None

    def push(self, token_id: int, eos_ids: frozenset[int], decode: DecodeFn) -> None:
        # The end-of-sequence token counts as generated (it cost a step) but is never shown.
        self.token_ids.append(token_id)
        if token_id in eos_ids:
            self.finish_reason = "stop"
            return
        if self.request.stop:
            self.text = decode(self.token_ids)
            hits = [i for i in (self.text.find(s) for s in self.request.stop) if i >= 0]
            if hits:
                self.stop_at = min(hits)
                self.finish_reason = "stop"
                return
        if len(self.token_ids) >= self.request.max_new_tokens:
            self.finish_reason = "length"

    def output(self, eos_ids: frozenset[int], decode: DecodeFn) -> RowOutput:
        shown = [t for t in self.token_ids if t not in eos_ids]
        text = self.text if self.text is not None else decode(shown)
        if self.stop_at is not None:
            text = text[: self.stop_at]
        return RowOutput(text, tuple(self.token_ids), self.finish_reason or "length")


def generate(
    model: Any,
    rows: Sequence[RowRequest],
    *,
    pad_id: int,
    eos_ids: frozenset[int],
    decode: DecodeFn,
    should_stop: ShouldStop | None = None,
    on_row_done: OnRowDone | None = None,
) -> BatchOutput:
    """Generate a continuation for every row, one batched forward pass per step."""
    device = model.device
    states = [_Row(r, seeded_generator(r.temperature, r.seed, device)) for r in rows]
    input_ids, mask = left_pad([r.prompt_ids for r in rows], pad_id, device)
    # Left padding shifts each row's tokens right; positions must still count from its first
    # real token, or the same prompt would decode differently alone and in a batch.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, cache = _forward(model, input_ids, mask, positions, None)
    next_positions = positions[:, -1] + 1
    live = list(range(len(states)))
    steps = 1
    while True:
        tokens = pick_tokens(logits, [states[i] for i in live])
        for i, token_id in zip(live, tokens.tolist(), strict=True):
            states[i].push(token_id, eos_ids, decode)
            if states[i].finish_reason is None and should_stop and should_stop(rows[i].request_id):
                states[i].finish_reason = "cancelled"
            if states[i].finish_reason is not None and on_row_done is not None:
                on_row_done(i, states[i].output(eos_ids, decode))
        keep = [b for b, i in enumerate(live) if states[i].finish_reason is None]
        if not keep:
            break
        if len(keep) < len(live):
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            tokens, mask, next_positions = tokens[index], mask[index], next_positions[index]
            live = [live[b] for b in keep]
        mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=-1)
        logits, cache = _forward(model, tokens[:, None], mask, next_positions[:, None], cache)
        next_positions = next_positions + 1
        steps += 1
    outputs = [s.output(eos_ids, decode) for s in states]
    return BatchOutput(outputs, padded_prompt_len=int(input_ids.shape[1]), steps=steps)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask, padded on the left so every row ends at the last column."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            input_ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), mask.to(device)


def pick_tokens(logits: torch.Tensor, rows: Sequence[_Row]) -> torch.Tensor:
    """The next token of every row: argmax for greedy rows, a seeded draw for sampling ones."""
    tokens = logits.argmax(dim=-1)
    for b, row in enumerate(rows):
        if row.request.temperature > 0:
            tokens[b] = sample_token(
                logits[b], row.request.temperature, row.request.top_p, row.generator
            )
    return tokens


def _forward(
    model: Any,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: Any,
) -> tuple[torch.Tensor, Any]:
    """Logits of each row's last position, and the KV cache grown by ``input_ids``' width."""
    out = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits: torch.Tensor = out.logits[:, -1, :]
    return logits, out.cache
