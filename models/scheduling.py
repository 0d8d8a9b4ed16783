"""Scheduling arithmetic of the transformers engine. Pure: no torch, numbers in, numbers out."""

from __future__ import annotations

from collections.abc import Sequence


def prefill_shape(remaining: Sequence[int], budget: int) -> tuple[int, int]:
    """How many of the oldest prefilling sequences take a chunk this step, and its width.

    A forward is a rectangle (rows x width): a row with less prompt left than the width would
    be padding, which costs as much as prompt. So every chosen row takes the same width, no
    more than any of them has left, and the rows and width are those that put the most prompt
    tokens into ``budget``, oldest first (ties: more rows).
    """
    best = (1, max(1, min(remaining[0], budget)))
    narrowest = remaining[0]
    for count in range(2, len(remaining) + 1):
        narrowest = min(narrowest, remaining[count - 1])
        width = min(narrowest, budget // count)
        if width < 1:
            break
        if count * width >= best[0] * best[1]:
            best = (count, width)
    return best


def common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    """How many tokens two prompts start with in common."""
    if not first or not second or first[0] != second[0]:
        return 0
    length = min(len(first), len(second))
    return next((i for i in range(length) if first[i] != second[i]), length)


def round_up(value: int, block: int) -> int:
    return -(-value // block) * block
