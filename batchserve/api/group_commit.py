"""Admission with group commit: concurrent submits share one transaction and one publish.

A request is accepted once its row is committed; publishing to the broker follows, and a
request whose publish never completes (the broker down, the process killed in between) is
published later by maintenance. Concurrent submits ride the same transaction, the way a database
groups commits: under load each round trip carries many requests, at low load one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import replace

from batchserve.api.joiners import JoinOffers
from batchserve.core.broker import RequestQueue
from batchserve.core.clock import deployment_time
from batchserve.core.domain import QueueMessage, SubmitCommand
from batchserve.core.errors import IdempotencyConflict, IdempotencyInProgress, Unavailable
from batchserve.core.logs import get_logger, log_request_ids
from batchserve.core.metrics import metrics
from batchserve.core.store import Admission, JobStore

log = get_logger("batchserve.admission")

_Waiting = tuple[SubmitCommand, "asyncio.Future[Admission]"]
# How often requests still queued are marked published, at most (see _mark_published_forever).
MARK_EVERY_S = 0.5


def _observe_admitted(admissions: Sequence[Admission]) -> None:
    """Count the requests this group committed and log them, a line for each model, lane and
    tenant among them with their ids (as the store logs their later changes): each request's
    history starts here."""
    together: dict[tuple[str, str, str], list[str]] = {}
    for admission in admissions:
        record = admission.record
        key = (record.model, record.lane.value, record.tenant)
        together.setdefault(key, []).append(str(record.id))
    counter = metrics().admissions
    for (model, lane, tenant), ids in together.items():
        counter.labels(model, lane).inc(len(ids))
        log_request_ids(log, "requests_accepted", ids, model=model, lane=lane, tenant=tenant)


class Admitter:
    def __init__(
        self,
        store: JobStore,
        queue: RequestQueue,
        *,
        max_group: int = 512,
        max_inflight_flushes: int = 4,
        mark_every_s: float = MARK_EVERY_S,
        faults: frozenset[str] = frozenset(),
        joiners: JoinOffers | None = None,
    ) -> None:
        self._store = store
        self._queue = queue
        self._joiners = joiners
        self._max_group = max_group
        self._flush_slots = asyncio.Semaphore(max_inflight_flushes)
        self._flushes: set[asyncio.Task[None]] = set()
        self._faults = faults
        self._waiting: list[_Waiting] = []
        self._admitting: set[tuple[str, str]] = set()
        self._kick = asyncio.Event()
        self._published: list[tuple[list[str], float]] = []  # ids and when they were published
        self._mark_every_s = mark_every_s
        self._published_kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.broker_healthy = True

    def start(self) -> None:
        if self._joiners is not None:
            self._joiners.start()
        self._tasks = [
            asyncio.create_task(self._flush_forever()),
            asyncio.create_task(self._mark_published_forever()),
        ]

    async def stop(self, timeout_s: float = 15.0) -> None:
        """Finish what is admitted, then stop. A flush still running after ``timeout_s`` is
        cancelled: its rows are committed or not, and maintenance publishes the former."""
        give_up = time.monotonic() + timeout_s
        while (self._waiting or self._flushes) and time.monotonic() < give_up:
            await asyncio.sleep(0.01)
        if self._waiting or self._flushes:
            log.warning(
                "admitter_stop_timeout", waiting=len(self._waiting), flushes=len(self._flushes)
            )
            for flush in list(self._flushes):
                flush.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await flush
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._published:
            with contextlib.suppress(Unavailable):
                await self._store.mark_published_groups(self._published)
        if self._joiners is not None:
            await self._joiners.close()

    async def submit(self, command: SubmitCommand) -> Admission:
        key = None
        if command.idempotency_key is not None:
            key = (command.tenant, command.idempotency_key)
            if key in self._admitting:
                raise IdempotencyInProgress("a request with this Idempotency-Key is being admitted")
            self._admitting.add(key)
        try:
            future: asyncio.Future[Admission] = asyncio.get_running_loop().create_future()
            self._waiting.append((command, future))
            self._kick.set()
            return await future
        finally:
            if key is not None:
                self._admitting.discard(key)

    async def _flush_forever(self) -> None:
        """Start a flush whenever submits wait and a flush slot is free.

        A few flushes run at once, so a submit never waits behind another's round trips at low
        load; when every slot is busy, submits pile up and the next flush takes them together.
        """
        while True:
            await self._kick.wait()
            self._kick.clear()
            while self._waiting:
                await self._flush_slots.acquire()
                group = self._waiting[: self._max_group]
                del self._waiting[: self._max_group]
                task = asyncio.create_task(self._flush_released(group))
                self._flushes.add(task)
                task.add_done_callback(self._flushes.discard)

    async def _flush_released(self, group: Sequence[_Waiting]) -> None:
        try:
            await self._flush(group)
        except Exception as error:  # a bug: its callers hear it rather than wait for ever
            log.exception("admission_failed", count=len(group))
            for _, future in group:
                if not future.done():
                    future.set_exception(error)
        finally:
            self._flush_slots.release()

    async def _flush(self, group: Sequence[_Waiting]) -> None:
        commands = [command for command, _ in group]
        offering = self._offer(commands)
        try:
            await self._admit(group, commands, offering)
        finally:
            if offering is not None and not offering.done():
                offering.cancel()  # this flush was cancelled: nothing is published

    async def _admit(
        self,
        group: Sequence[_Waiting],
        commands: list[SubmitCommand],
        offering: asyncio.Task[dict[str, str]] | None,
    ) -> None:
        try:
            outcomes = await self._store.submit(commands)
        except Exception as error:  # the database refused the whole group: each caller hears it
            for _, future in group:
                if not future.done():
                    future.set_exception(error)
            if offering is not None:
                # Let the offer finish: a request offered that was never committed is never
                # claimed into the batch, so no answer of it is kept.
                await offering
            return
        if "exit_after_commit" in self._faults:
            os._exit(3)  # test fault: die between commit and publish
        new = [o for o in outcomes if isinstance(o, Admission) and o.message is not None]
        _observe_admitted(new)
        # Committed is accepted: each caller hears now, and the publish follows while this flush
        # still holds its slot (so a slow broker still slows admission). A publish that never
        # completes costs latency, not the request: maintenance publishes what stays unmarked.
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, IdempotencyConflict | IdempotencyInProgress):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        messages = [o.message for o in new if o.message is not None]
        if offering is not None:
            # What joined a batch sent ahead says so in its message.
            joined = await offering
            messages = [replace(m, joined=joined[m.id]) if m.id in joined else m for m in messages]
        await self._publish(messages)

    def _offer(self, commands: list[SubmitCommand]) -> asyncio.Task[dict[str, str]] | None:
        """The group offered to the batches that take late joiners, while it commits
        (``batchserve/api/joiners.py``); None when no such batch is open."""
        if self._joiners is None or not self._joiners.any_open():
            return None
        return asyncio.create_task(self._joiners.offer(commands))

    async def _publish(self, messages: list[QueueMessage]) -> None:
        if not messages:
            return
        try:
            await self._queue.publish(messages)
        except Exception as error:  # whatever failed, maintenance publishes them later
            if self.broker_healthy or not isinstance(error, Unavailable):
                log.warning(
                    "publish_failed",
                    count=len(messages),
                    error=error,
                    note="maintenance republishes",
                )
            self.broker_healthy = False
            return
        self.broker_healthy = True
        self._published.append(([m.id for m in messages], deployment_time()))
        self._published_kick.set()

    async def _mark_published_forever(self) -> None:
        while True:
            await self._published_kick.wait()
            # Let groups accumulate: only requests still queued are marked (those the batcher
            # has claimed need no mark), so by the time the mark runs most of an interactive
            # group has left the queue and the statement writes nothing for it.
            await asyncio.sleep(self._mark_every_s)
            self._published_kick.clear()
            groups, self._published = self._published, []
            try:
                await self._store.mark_published_groups(groups)
            except Unavailable as error:
                count = sum(len(ids) for ids, _ in groups)
                log.warning("mark_published_failed", count=count, error=error)
            except asyncio.CancelledError:
                self._published = groups + self._published  # stop() marks them
                raise
