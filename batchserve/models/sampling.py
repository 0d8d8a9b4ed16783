"""Choosing the next token: the request's logit processing (penalties, bias, a grammar's mask,
a minimum length), then greedy, or a seeded draw at a temperature from what top-k, top-p and
min-p leave."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class Shaping:
    """What a request asks of its logits before a token is chosen (OpenAI's and vLLM's
    meanings): ``presence_penalty`` and ``frequency_penalty`` lower the logit of every token
    generated so far, once and once per time; ``repetition_penalty`` divides a positive logit
    (multiplies a negative one) of every token in the prompt or generated; ``logit_bias`` adds
    to given tokens; ``min_tokens`` forbids ending before that many tokens."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0

    @property
    def active(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
            or bool(self.logit_bias)
            or self.min_tokens > 0
        )


def shape_logits(
    logits: torch.Tensor,
    shaping: Shaping,
    prompt_ids: list[int],
    generated: list[int],
    eos_ids: Collection[int],
) -> torch.Tensor:
    """``logits`` (one row, float) with the request's processing applied, in place."""
    if shaping.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(prompt_ids) | set(generated)), dtype=torch.long)
        if len(seen):
            values = logits[seen]
            logits[seen] = torch.where(
                values > 0, values / shaping.repetition_penalty, values * shaping.repetition_penalty
            )
    if generated and (shaping.presence_penalty or shaping.frequency_penalty):
        counts = Counter(generated)
        ids = torch.tensor(list(counts), dtype=torch.long)
        times = torch.tensor(list(counts.values()), dtype=logits.dtype)
        logits[ids] -= shaping.presence_penalty + shaping.frequency_penalty * times
    for token, bias in shaping.logit_bias:
        if token < logits.shape[-1]:
            logits[token] += bias
    if len(generated) < shaping.min_tokens:
        for token in eos_ids:
            if token < logits.shape[-1]:
                logits[token] = float("-inf")
    return logits


def allow_only(logits: torch.Tensor, bitmask: bytes) -> torch.Tensor:
    """``logits`` with every token the grammar's mask (a bit a token, 32-bit little-endian
    words, as llguidance computes it) does not allow set to minus infinity, in place."""
    words = np.frombuffer(bitmask, dtype="<u4")
    allowed = np.unpackbits(words.view(np.uint8), bitorder="little")[: logits.shape[-1]]
    blocked = torch.from_numpy(allowed == 0)
    if blocked.shape[-1] < logits.shape[-1]:  # tokens past the tokenizer's vocabulary
        blocked = torch.cat(
            [blocked, torch.ones(logits.shape[-1] - blocked.shape[-1], dtype=torch.bool)]
        )
    logits[blocked] = float("-inf")
    return logits


def sample_token(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    *,
    top_k: int = 0,
    min_p: float = 0.0,
) -> torch.Tensor:
    """Draw one token from softmax(logits / temperature), restricted to the ``top_k`` most
    likely (0: all), to the top-p nucleus, and to those at least ``min_p`` times as likely as
    the most likely one."""
    logits = logits.float()
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits / temperature, dim=-1)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        reach = top_p if min_p == 0.0 else top_p * float(sorted_probs.sum())
        outside = sorted_probs.cumsum(-1) - sorted_probs >= reach
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, 1, generator=generator)[0]


def seeded_generator(
    temperature: float, seed: int | None, device: torch.device
) -> torch.Generator | None:
    """A request's own random stream (``None`` for greedy): the same seed, the same draws,
    whatever else runs beside it."""
    if temperature <= 0:
        return None
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
