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
