"""Admission by deadline: refuse at once a request that the backlog ahead makes hopeless.

The backlog is the batcher's latest published load plus what this API process let in since
(:class:`RecentAdmissions`): a burst of submits all read the same snapshot, and without counting
each other each one saw an empty queue, was accepted, and all but the first expired in the
batcher before they could run.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from batchserve.batching.estimate import SequenceCost
from batchserve.batching.eta import estimate_engine_finish, estimate_finish
from batchserve.core.domain import Lane, SubmitCommand, from_epoch, to_epoch
from batchserve.core.errors import DeadlineUnmeetable
from batchserve.core.loadboard import LoadBoard, LoadSnapshot


@dataclass
class RecentAdmissions:
    """The requests this API process let in (or is letting in) that the batcher's latest
    snapshot cannot count yet, by model and lane: their admission times, sorted."""

    _at: dict[tuple[str, Lane], list[float]] = field(default_factory=dict)

    def ahead(self, model: str, lane: Lane, since: float) -> int:
        """Those a new request of ``lane`` queues behind, admitted at ``since`` or later (the
        snapshot of ``since`` counts the earlier ones); interactive go before bulk."""
        count = 0
        for each in (Lane.INTERACTIVE, Lane.BULK) if lane is Lane.BULK else (Lane.INTERACTIVE,):
            times = self._at.get((model, each))
            if times:
                del times[: bisect.bisect_left(times, since)]
                count += len(times)
        return count

    def add(self, model: str, lane: Lane, at: float) -> None:
        bisect.insort(self._at.setdefault((model, lane), []), at)

    def discard(self, model: str, lane: Lane, at: float) -> None:
        """One that was not admitted after all (refused later, or a replay of an earlier one)."""
        times = self._at.get((model, lane), [])
        index = bisect.bisect_left(times, at)
        if index < len(times) and times[index] == at:
            del times[index]


async def refuse_if_hopeless(
    board: LoadBoard, command: SubmitCommand, now: float, recent: RecentAdmissions
) -> None:
    """Raise :class:`DeadlineUnmeetable` when the estimated completion is past the deadline;
    else count the request in ``recent`` (the caller discards it if it is not admitted).

    The estimate is the batcher's latest published load: requests ahead (interactive before
    bulk) with those this process admitted since, when each worker slot frees up (engine
    models: the room their engines have), and the batcher's own time estimate. Without a fresh
    snapshot, or with no worker at all, the request is admitted: we don't know better.
    """
    snapshot = await board.fresh(command.model, now)
    if snapshot is None:
        return
    ahead = snapshot.ahead_of(bulk=command.lane is Lane.BULK)
    # No await from here to add(): concurrent submits count each other.
    ahead += recent.ahead(command.model, command.lane, snapshot.at)
    finish = _finish(snapshot, command, now, ahead)
    deadline = to_epoch(command.deadline)
    if finish is None or finish <= deadline:
        recent.add(command.model, command.lane, now)
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
