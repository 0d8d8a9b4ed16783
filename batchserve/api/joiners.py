"""The API's late joiners: what it admits while a batch sent ahead still takes joiners goes
to that batch's join box at once (``batchserve/core/joins.py``).

The batcher announces each batch it sends behind a running one with room
(``BatchJoinable``); a request admitted before that batch's model starts rides in it if it
reaches the box first. Through the batcher it gets there after the broker's delivery, the
batcher's wake-up and a read of its inputs; from here, one Redis round trip, sent with its
commit. Its message then names the batch, and the batcher settles it with that batch (acked
once Postgres says the worker claimed it, batched again if it is still queued). Whatever
happens here only decides how soon a request runs, never whether: an offer refused (the box
sealed or full) or unsure (Redis failing) leaves the request to the batcher.

The offer goes out with the group's commit, not after it (``Admitter``): the race to a box
about to be sealed is shorter by the commit's round trip. The worker keeps only the answers of
the joiners its claim finds queued in Postgres, so a request offered whose commit comes after
that claim waits for a batch more, and one that is never committed (the group's transaction
failed, or the submit repeated an earlier one's ``Idempotency-Key``) runs in the batch and its
answer is thrown away: it costs a place in the batch, never an answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from batchserve.core.clock import deployment_time
from batchserve.core.domain import BatchItem, BatchJoinable, Event, QueueMessage, SubmitCommand
from batchserve.core.events import JOINS, EventBus, Subscription
from batchserve.core.joins import JoinBox
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
from batchserve.core.records import command_message
from batchserve.core.store import ClaimedRequest

log = get_logger("batchserve.api")


@dataclass(slots=True)
class _Box:
    batch: BatchJoinable
    offered: int = 0  # by this process


class JoinOffers:
    def __init__(
        self,
        joins: JoinBox,
        events: EventBus,
        clock: Callable[[], float] = deployment_time,
    ) -> None:
        self._joins = joins
        self._events = events
        self._clock = clock
        self._open: dict[str, list[_Box]] = {}  # by model, as announced
        self._subscription: Subscription | None = None

    def start(self) -> None:
        self._subscription = self._events.subscribe(self._on_event, topics=(JOINS,))

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, BatchJoinable):
            self._open_boxes(event.model, self._clock()).append(_Box(event))

    def _open_boxes(self, model: str, now: float) -> list[_Box]:
        """The model's boxes still open as far as this process knows, oldest first (a batch
        past its expected end has surely started)."""
        boxes = self._open.setdefault(model, [])
        boxes[:] = [b for b in boxes if b.batch.ends_by > now and b.offered < b.batch.room]
        return boxes

    def any_open(self) -> bool:
        """Whether a box may be open: without one an offer has nothing to do."""
        return any(self._open.values())

    async def offer(self, commands: Sequence[SubmitCommand]) -> dict[str, str]:
        """Offer requests being admitted to the open boxes of their models: the batch each
        offered one went to, by request id."""
        joined: dict[str, str] = {}
        if not self.any_open():
            return joined
        now = self._clock()
        admitted = [(command, command_message(command)) for command in commands]
        for model in {command.model for command in commands}:
            # Those expected still to be waiting for their slot first, the soonest to start
            # first; then those whose running batch may have overrun its estimate.
            boxes = sorted(
                self._open_boxes(model, now),
                key=lambda b: (b.batch.starts_by < now, b.batch.starts_by),
            )
            for box in boxes:
                fit = [
                    (command, message)
                    for command, message in admitted
                    if message.model == model
                    and message.id not in joined
                    and box.batch.takes(message)
                ][: box.batch.room - box.offered]
                if fit and await self._offer(box, fit, now):
                    joined.update((message.id, box.batch.batch_id) for _, message in fit)
        return joined

    async def _offer(
        self, box: _Box, fit: list[tuple[SubmitCommand, QueueMessage]], now: float
    ) -> bool:
        """Whether ``fit`` went into ``box``, or may have (Redis failing: the batcher's
        settling finds out); a box that refused is offered nothing more."""
        joiners = [_item(command, message, now) for command, message in fit]
        try:
            accepted = await self._joins.offer(
                uuid.UUID(box.batch.batch_id), joiners, box.batch.room
            )
        except Exception as error:
            log.warning("join_offer_failed", batch_id=box.batch.batch_id, error=error)
            box.offered = box.batch.room
            return True
        if not accepted:  # sealed (its model started) or full: the batcher takes them
            box.offered = box.batch.room
            return False
        box.offered += len(fit)
        metrics().batch_joins_offered.labels(box.batch.model, "api").inc(len(fit))
        return True


def _item(command: SubmitCommand, message: QueueMessage, now: float) -> BatchItem:
    """The request as the worker runs it (what the batcher's offer reads back from Postgres)."""
    stored = ClaimedRequest(
        message.id, command.input, command.messages, command.params, message.created_at
    )
    return stored.item(now)
