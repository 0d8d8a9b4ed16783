"""The way back onto the broker for requests the store has queued again: publish them, then mark
them published.

A requeue clears ``published_at`` in the transaction that puts a request back in the queue;
maintenance's republish pass publishes every queued request left unmarked for
``republish_after_s``. So whoever publishes a requeue also marks it (else the same requests
are published twice, ~5 s apart), and one whose publish or mark fails leaves it to
maintenance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchserve.core.broker import RequestQueue
from batchserve.core.domain import QueueMessage
from batchserve.core.errors import Unavailable
from batchserve.core.logs import get_logger
from batchserve.core.store import JobStore

log = get_logger("batchserve.republish")


async def publish_and_mark(
    queue: RequestQueue,
    store: JobStore,
    messages: Sequence[QueueMessage],
    *,
    now: float | None = None,
) -> None:
    """Publish ``messages`` and record that the broker has them (at ``now``: now when None).
    Raises what the broker or the store raise."""
    if not messages:
        return
    await queue.publish(messages)
    await store.mark_published([m.id for m in messages], now=now)


async def republish(
    queue: RequestQueue,
    store: JobStore,
    messages: Sequence[QueueMessage],
    *,
    now: float | None = None,
    errors: tuple[type[Exception], ...] = (Unavailable,),
    **fields: Any,
) -> bool:
    """:func:`publish_and_mark` requeued ``messages``; ``errors`` are logged with ``fields``
    rather than raised, as maintenance republishes what stays unpublished. False then."""
    try:
        await publish_and_mark(queue, store, messages, now=now)
    except errors as error:
        log.warning("requeue_publish_failed", error=error, **fields)
        return False
    return True
