"""The API's late joiners: what it admits while a batch sent ahead still takes joiners goes
to that batch's join box at once (``batchserve/core/joins.py``).

The batcher announces each batch it sends behind a running one with room
(``BatchJoinable``); a request admitted before that batch's model starts rides in it if it
reaches the box first. Through the batcher it gets there after the broker's delivery, the
batcher's wake-up and a read of its inputs; from here, one Redis round trip after its commit.
Its message then names the batch, and the batcher settles it with that batch (acked once
Postgres says the worker claimed it, batched again if it is still queued). Whatever happens
here only decides how soon a request runs, never whether: an offer refused (the box sealed or
full) or unsure (Redis failing) leaves the request to the batcher.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from batchserve.core.clock import deployment_time
from batchserve.core.domain import BatchItem, BatchJoinable, Event, QueueMessage, SubmitCommand
from batchserve.core.events import JOINS, EventBus, Subscription
from batchserve.core.joins import JoinBox
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
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

    async def offer(
        self, admitted: Sequence[tuple[SubmitCommand, QueueMessage]]
    ) -> list[QueueMessage]:
        """Offer what was just admitted (committed) to the open boxes of its models: the
        messages to publish, each offered one naming its batch."""
        messages = [message for _, message in admitted]
        if not self._open:
            return messages
        now = self._clock()
        joined: dict[str, str] = {}
        for model in {message.model for message in messages}:
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
        if not joined:
            return messages
        return [replace(m, joined=joined[m.id]) if m.id in joined else m for m in messages]

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
