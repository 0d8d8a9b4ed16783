"""Choosing the next token: greedy, or a seeded draw from the top-p nucleus at a temperature."""

from __future__ import annotations

import torch


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> torch.Tensor:
    """Draw one token from softmax(logits / temperature), restricted to the top-p nucleus."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
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
