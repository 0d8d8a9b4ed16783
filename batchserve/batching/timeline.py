"""Worker slots as the batcher sees them: which are idle, and when each busy one frees. Pure.

A slot counts as free ``lead_s`` before its batch is expected to end, so the next batch can be
formed and delivered while the running one finishes: the worker holds it (Celery prefetch) and
starts it the moment it is done, instead of idling through a whole dispatch round trip. At most
one batch waits per slot.
"""

from __future__ import annotations

import uuid


class SlotTimeline:
    def __init__(self, lead_s: float = 0.0) -> None:
        self.lead_s = lead_s
        self.capacity = 0
        self.idle = 0
        # The last batch on each busy slot, with its expected end; the slot is free after it.
        self._tails: dict[uuid.UUID, float] = {}
        # A running batch -> the batch queued behind it on the same slot.
        self._next: dict[uuid.UUID, uuid.UUID] = {}

    def __contains__(self, batch_id: object) -> bool:
        return batch_id in self._tails or batch_id in self._next

    def __len__(self) -> int:
        """Batches dispatched and not yet known to be finished."""
        return len(self._tails) + len(self._next)

    def batches(self) -> set[uuid.UUID]:
        return set(self._tails) | set(self._next)

    def resize(self, capacity: int) -> None:
        """Worker slots now live; busy slots beyond it drain before they stop counting."""
        self.capacity = capacity
        self.idle = max(0, capacity - len(self._tails))

    def free_slots(self, now: float) -> int:
        """Slots that can take a batch now: idle, or running one due to end within ``lead_s``
        with nothing queued behind it. A slot whose batch overruns its estimate takes no more
        until it reports: the queue at a worker is never deeper than one."""
        waiting = set(self._next.values())
        soon = sum(
            1
            for batch_id, end in self._tails.items()
            if end <= now + self.lead_s and batch_id not in waiting
        )
        busy = len(self._tails) - soon
        return max(0, min(self.idle + soon, self.capacity - busy))

    def next_free_at(self, now: float) -> float | None:
        """When a busy slot next counts as free (its end less the lead), if one will."""
        ends = [end - self.lead_s for end in self._tails.values() if end - self.lead_s > now]
        return min(ends, default=None)

    def busy_until(self, now: float) -> tuple[float, ...]:
        """When each busy slot is expected to free up (the policy paces batches with it)."""
        return tuple(end for end in self._tails.values() if end > now)

    def queued_behind(self, batch_id: uuid.UUID) -> bool:
        """Whether the batch waits behind a running one on its slot."""
        return batch_id in self._next.values()

    def assign(self, batch_id: uuid.UUID, now: float, run_s: float) -> float:
        """Put a dispatched batch on the slot that frees first; returns its expected end."""
        if batch_id in self._tails:  # already placed: a second placement would cost a slot
            return self._tails[batch_id]
        waiting = set(self._next.values())
        running = {b: end for b, end in self._tails.items() if b not in waiting}
        if self.idle > 0:
            self.idle -= 1
            start = now
        elif running:
            before = min(running, key=running.__getitem__)
            start = max(now, self._tails.pop(before))
            self._next[before] = batch_id
        else:  # no slot known (a batch found open at start-up): count it anyway
            start = now
        end = start + run_s
        self._tails[batch_id] = end
        return end

    def release(self, batch_id: uuid.UUID, now: float, next_run_s: float | None = None) -> bool:
        """A batch ended; its slot is free, or runs the batch queued behind it from now on."""
        successor = self._next.pop(batch_id, None)
        if successor is not None:
            if successor in self._tails and next_run_s is not None:
                self._tails[successor] = now + next_run_s
            return True
        if self._tails.pop(batch_id, None) is None:
            return False
        for before, queued in list(self._next.items()):
            if queued == batch_id:  # its predecessor's end was missed: both are done
                del self._next[before]
        if self.idle + len(self._tails) < self.capacity:
            self.idle += 1
        return True


class LeadTuner:
    """Learns how early to send a slot its next batch. Pure.

    The worker tells, for each batch sent behind a running one, how early it was: how long it
    waited at its slot for the running model to end (positive), or how long the slot stood
    idle before it arrived (negative: late). Early costs latency (requests arriving in the
    lead miss the batch and wait a whole batch more); late costs the slot's time. The lead
    follows the quantile ``late_share`` of those margins: each late batch raises it by
    ``step_s * (1 - late_share)``, each early one lowers it by ``step_s * late_share``, so it
    settles where about ``late_share`` of the batches come late (a stochastic quantile
    estimate). On an idle 2-core machine the hand-over (claim, Celery, lease) took 9-13 ms
    where the fixed lead was 30 ms; under load it grows, and the lead with it.
    """

    def __init__(
        self,
        lead_s: float,
        *,
        min_s: float = 0.005,
        max_s: float = 0.1,
        late_share: float = 0.1,
        step_s: float = 0.002,
    ) -> None:
        if not 0.0 < late_share < 1.0:
            raise ValueError("late_share must be between 0 and 1")
        self.min_s, self.max_s = min_s, max_s
        self.late_share = late_share
        self.step_s = step_s
        self.lead_s = min(max(lead_s, min_s), max_s)
        self.early = 0
        self.late = 0

    def observe(self, early_s: float) -> float:
        """One batch's margin at its slot (negative: late); returns the new lead."""
        if early_s < 0.0:
            self.late += 1
            change = self.step_s * (1.0 - self.late_share)
        else:
            self.early += 1
            change = -self.step_s * self.late_share
        self.lead_s = min(max(self.lead_s + change, self.min_s), self.max_s)
        return self.lead_s
