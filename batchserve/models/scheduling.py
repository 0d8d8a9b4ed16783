"""Scheduling arithmetic of the transformers engine. Pure: no torch, numbers in, numbers out."""

from __future__ import annotations

from collections.abc import Sequence


def prefill_chunks(remaining: Sequence[int], budget: int) -> list[int]:
    """How many prompt tokens each of the oldest prefilling sequences computes this step.

    Chunks are packed into one forward with no padding (see ``models.kv_rows``), so the oldest
    takes all it has left up to the budget, the next what remains of the budget, and so on: a
    forward is ``budget`` tokens whenever that much prompt is waiting.
    """
    chunks: list[int] = []
    for left in remaining:
        if budget <= 0:
            break
        chunks.append(min(left, budget))
        budget -= chunks[-1]
    return chunks


def common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """How many tokens two prompts start with in common."""
    if not first or not second or first[0] != second[0]:
        return 0
    length = min(len(first), len(second))
    return next((i for i in range(length) if first[i] != second[i]), length)


def round_up(value: int, block: int) -> int:
    return -(-value // block) * block
