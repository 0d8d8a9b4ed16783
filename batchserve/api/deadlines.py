"""Admission by deadline: refuse at once a request that the backlog ahead makes hopeless."""

from __future__ import annotations

from batchserve.batching.estimate import SequenceCost
from batchserve.batching.eta import estimate_engine_finish, estimate_finish
from batchserve.core.domain import Lane, SubmitCommand, from_epoch, to_epoch
from batchserve.core.errors import DeadlineUnmeetable
from batchserve.core.loadboard import LoadBoard, LoadSnapshot


async def refuse_if_hopeless(board: LoadBoard, command: SubmitCommand, now: float) -> None:
    """Raise :class:`DeadlineUnmeetable` when the estimated completion is past the deadline.

    The estimate is the batcher's latest published load: requests ahead (interactive before
    bulk), when each worker slot frees up (engine models: the room their engines have), and the
    batcher's own time estimate. Without a fresh snapshot, or with no worker at all, the request
    is admitted: we don't know better.
    """
    snapshot = await board.fresh(command.model, now)
    if snapshot is None:
        return
    ahead = snapshot.ahead_of(bulk=command.lane is Lane.BULK)
    finish = _finish(snapshot, command, now, ahead)
    deadline = to_epoch(command.deadline)
    if finish is None or finish <= deadline:
        return
    raise DeadlineUnmeetable(
        f"estimated completion in {finish - now:.2f} s is past the deadline "
        f"in {deadline - now:.2f} s ({ahead} requests ahead on {snapshot.slots} "
        f"{'sequence' if snapshot.kind == 'engine' else 'slot'}(s))",
        retry_after_s=max(1.0, finish - deadline),
        field="deadline",
        deadline=from_epoch(deadline).isoformat(),
        estimated_completion=from_epoch(finish).isoformat(),
        estimated_s=round(finish - now, 3),
        requests_ahead=ahead,
    )


def _finish(snapshot: LoadSnapshot, command: SubmitCommand, now: float, ahead: int) -> float | None:
    if snapshot.kind != "engine":
        return estimate_finish(
            now=now,
            ahead=ahead,
            slot_free_at=snapshot.slot_free_at,
            max_batch_size=snapshot.max_batch_size,
            batch_s=snapshot.batch_s,
            max_batch_delay_s=snapshot.max_batch_delay_s,
        )
    terms = snapshot.estimate
    own_s = snapshot.batch_s
    if "per_token_s" in terms:
        cost = SequenceCost(
            terms["fixed_s"], terms["per_prompt_token_s"], terms["per_token_s"], terms["floor_s"]
        )
        own_s = cost.seconds(command.prompt_tokens, command.max_tokens)
    return estimate_engine_finish(
        now=now,
        ahead=ahead,
        free_seqs=snapshot.free_seqs,
        capacity_seqs=snapshot.slots,
        typical_s=snapshot.batch_s,
        own_s=own_s,
    )
