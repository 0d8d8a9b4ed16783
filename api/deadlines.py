"""Admission by deadline: refuse at once a request that the backlog ahead makes hopeless."""

from __future__ import annotations

from batching.admission import estimate_finish
from core.domain import Lane, SubmitCommand, from_epoch, to_epoch
from core.errors import DeadlineUnmeetable
from core.loadboard import LoadBoard


async def refuse_if_hopeless(board: LoadBoard, command: SubmitCommand, now: float) -> None:
    """Raise :class:`DeadlineUnmeetable` when the estimated completion is past the deadline.

    The estimate is the batcher's latest published load: requests ahead (interactive before
    bulk), when each worker slot frees up, and the batch-time estimate. Without a fresh
    snapshot, or with no worker at all, the request is admitted: we don't know better.
    """
    snapshot = await board.fresh(command.model, now)
    if snapshot is None:
        return
    ahead = snapshot.ahead_of(bulk=command.lane is Lane.BULK)
    finish = estimate_finish(
        now=now,
        ahead=ahead,
        slot_free_at=snapshot.slot_free_at,
        max_batch_size=snapshot.max_batch_size,
        batch_s=snapshot.batch_s,
        max_batch_delay_s=snapshot.max_batch_delay_s,
    )
    deadline = to_epoch(command.deadline)
    if finish is None or finish <= deadline:
        return
    raise DeadlineUnmeetable(
        f"estimated completion in {finish - now:.2f} s is past the deadline "
        f"in {deadline - now:.2f} s ({ahead} requests ahead on {snapshot.slots} slot(s))",
        retry_after_s=max(1.0, finish - deadline),
        field="deadline",
        deadline=from_epoch(deadline).isoformat(),
        estimated_completion=from_epoch(finish).isoformat(),
        estimated_s=round(finish - now, 3),
        requests_ahead=ahead,
    )
