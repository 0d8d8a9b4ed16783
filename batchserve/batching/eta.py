"""Admission by deadline: when would a request finish, given the work ahead of it? Pure.

"Say so early": a request whose estimated completion is already past its deadline is refused at
admission instead of accepted to expire later.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def estimate_finish(
    *,
    now: float,
    ahead: int,
    slot_free_at: Sequence[float],
    max_batch_size: int,
    batch_s: float,
    max_batch_delay_s: float = 0.0,
) -> float | None:
    """When a request with ``ahead`` requests before it would finish; ``None`` with no workers.

    Assumes batches ahead of it leave full, each on the first slot to free up (slots free at
    ``slot_free_at``: ``now`` for an idle slot, the expected end of the batch it runs otherwise),
    and that the request's own batch may wait up to ``max_batch_delay_s`` for company.
    """
    if not slot_free_at:
        return None
    free_at = [max(now, t) for t in slot_free_at]
    heapq.heapify(free_at)
    for _ in range(ahead // max(1, max_batch_size)):
        heapq.heapreplace(free_at, free_at[0] + batch_s)
    start = free_at[0]
    if ahead < max_batch_size:  # leading the queue: its batch may wait for company
        start = max(start, now + max_batch_delay_s)
    return start + batch_s


def estimate_engine_finish(
    *,
    now: float,
    ahead: int,
    free_seqs: int,
    capacity_seqs: int,
    typical_s: float,
    own_s: float,
) -> float | None:
    """When a request would finish on engines holding ``capacity_seqs`` sequences, ``free_seqs``
    of them free, with ``ahead`` requests before it; ``None`` with no engine at all.

    It starts at once if there is room for it after those ahead; otherwise once enough
    sequences have finished, a whole engine's worth every ``typical_s``. Then it takes its own
    ``own_s`` (its prompt and ``max_tokens`` at the learned speed: the same estimate the batcher
    expires it by).
    """
    if capacity_seqs <= 0:
        return None
    if ahead < free_seqs:
        return now + own_s
    rounds = (ahead - free_seqs) // capacity_seqs + 1
    return now + rounds * typical_s + own_s
