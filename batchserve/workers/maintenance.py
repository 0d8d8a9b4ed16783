"""Maintenance: reap expired leases, expire overdue requests, republish, prune old keys,
expired files and finished requests past their retention, and drive bulk jobs
(``workers.jobs``) alongside.

Every step is a conditional write, so several maintenance processes may run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from batchserve.core.broker import RequestQueue
from batchserve.core.clock import deployment_time
from batchserve.core.domain import BatchClosed, BatchOutcome
from batchserve.core.errors import Unavailable
from batchserve.core.events import EventBus
from batchserve.core.logs import get_logger
from batchserve.core.republish import publish_and_mark, republish
from batchserve.core.store import JobStore
from batchserve.workers.jobs import JobDriver

log = get_logger("batchserve.maintenance")


@dataclass(frozen=True, slots=True)
class MaintenanceConfig:
    tick_s: float = 0.5
    republish_after_s: float = 5.0
    republish_every_s: float = 2.0
    idempotency_retention_s: float = 86_400.0
    request_retention_s: float = 30 * 86_400.0
    prune_every_s: float = 3_600.0
    # Finished requests deleted a transaction, and at most this many transactions a prune.
    prune_chunk: int = 1000
    prune_chunks: int = 100


@dataclass(slots=True)
class TickReport:
    reaped_batches: int = 0
    requeued: int = 0
    expired: int = 0
    republished: int = 0
    pruned: int = 0
    files_deleted: int = 0
    requests_deleted: int = 0


class Maintenance:
    def __init__(
        self,
        *,
        store: JobStore,
        queue: RequestQueue,
        events: EventBus,
        config: MaintenanceConfig | None = None,
        jobs: JobDriver | None = None,
        clock: Callable[[], float] = deployment_time,
    ) -> None:
        self._store = store
        self._jobs = jobs
        self._queue = queue
        self._events = events
        self.config = config or MaintenanceConfig()
        self._clock = clock
        self._last_republish = 0.0
        self._last_prune = 0.0

    async def run(self) -> None:
        log.info("maintenance_started", tick_s=round(self.config.tick_s, 2))
        # Ingest and output files take seconds: the job driver runs beside the tick, not in it,
        # so a long ingest never delays lease reaping. Each tick's probe pokes the driver when
        # a job has work: it polls nothing itself.
        jobs = self._jobs
        driver = asyncio.create_task(jobs.run(poll=False)) if jobs is not None else None
        try:
            await self._loop()
        finally:
            if driver is not None:
                driver.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await driver

    async def _loop(self) -> None:
        while True:
            try:
                report = await self.tick(self._clock())
                if report.reaped_batches or report.expired or report.republished:
                    log.info(
                        "maintenance_tick",
                        reaped_batches=report.reaped_batches,
                        requeued=report.requeued,
                        expired=report.expired,
                        republished=report.republished,
                    )
            except Unavailable as error:
                log.warning("maintenance_backoff", error=error)
            except Exception:
                log.exception("maintenance_tick_failed")
            await asyncio.sleep(self.config.tick_s)

    async def tick(self, now: float) -> TickReport:
        """One read says which tasks have work (``JobStore.due``); only those run."""
        report = TickReport()
        due = await self._store.due(now, unpublished_before=now - self.config.republish_after_s)
        if self._jobs is not None:
            self._jobs.poke(ingest=due.ingest, settle=due.jobs)
        if due.leases:
            await self.reap(now, report)
        if due.overdue:
            report.expired = len(await self._store.expire_overdue(now))
        if due.unpublished and now - self._last_republish >= self.config.republish_every_s:
            self._last_republish = now
            await self.republish(now, report)
        if now - self._last_prune >= self.config.prune_every_s:
            self._last_prune = now
            report.pruned = await self._store.prune_idempotency(
                now - self.config.idempotency_retention_s
            )
            report.files_deleted = await self._store.delete_expired_files(now)
            report.requests_deleted = await self.prune_finished(now)
        return report

    async def prune_finished(self, now: float) -> int:
        """Delete the requests finished more than ``request_retention_s`` ago, a chunk a
        transaction, so that no transaction holds many rows for long."""
        before, deleted = now - self.config.request_retention_s, 0
        for _ in range(self.config.prune_chunks):
            chunk = await self._store.prune_finished(before, limit=self.config.prune_chunk)
            deleted += chunk
            if chunk < self.config.prune_chunk:
                break
        if deleted:
            log.info("requests_pruned", count=deleted, finished_before=before)
        return deleted

    async def reap(self, now: float, report: TickReport) -> None:
        for lease in await self._store.expired_leases(now):
            outcome = BatchOutcome.CRASHED if lease.started else BatchOutcome.ABANDONED
            reaped = await self._store.reap_batch(lease.batch_id, now=now, outcome=outcome)
            log.warning(
                "batch_reaped",
                batch_id=lease.batch_id,
                model=lease.model,
                outcome=outcome.value,
                requeued=len(reaped.requeued),
                ended=len(reaped.ended),
            )
            report.reaped_batches += 1
            report.requeued += len(reaped.requeued)
            await republish(self._queue, self._store, reaped.requeued, note="will republish")
            await self._events.publish(
                BatchClosed(model=lease.model, batch_id=str(lease.batch_id), outcome=outcome.value)
            )

    async def republish(self, now: float, report: TickReport) -> None:
        """Publish requests committed but never confirmed on the broker."""
        messages = await self._store.unpublished(now - self.config.republish_after_s)
        if not messages:
            return
        await publish_and_mark(self._queue, self._store, messages, now=now)
        report.republished = len(messages)
        log.warning("republished", count=len(messages))
