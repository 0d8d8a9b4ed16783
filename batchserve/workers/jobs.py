"""The job driver: moves bulk jobs along, from ``validating`` to an ending.

Two loops, run by ``batchserve maintenance`` (and the embedded mode):

- **ingest**: lease a validating job, validate its file (refusing it whole, with line numbers,
  on any bad line), then persist its requests a chunk at a time (``COPY`` on Postgres) and
  publish each chunk to the model's ``bulk`` queue (packs of requests, one confirmed round);
  then ``in_progress``.
  A driver that dies mid-ingest leaves its lease to run out; the next resumes where it stopped.
- **settle**: a job whose requests are all finished goes ``finalizing`` and then ``completed``
  with its output files; one past ``expires_at`` has its unfinished requests expired
  (``batch_expired``) and ends ``expired``; one ``cancelling`` has them cancelled and ends
  ``cancelled``. Every request transition goes through the store's verbs.

Several drivers may run at once: leases, conditional updates and ``SKIP LOCKED`` keep them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from batchserve.api.batch_files import render_files
from batchserve.api.batch_input import FileValidation
from batchserve.core.broker import RequestQueue
from batchserve.core.bulk import IngestClaim, JobStatus, LineError
from batchserve.core.clock import deployment_time
from batchserve.core.domain import (
    ErrorCode,
    Event,
    JobChanged,
    RequestState,
    SubmitCommand,
    from_epoch,
)
from batchserve.core.errors import Unavailable
from batchserve.core.events import JOBS, EventBus
from batchserve.core.logs import get_logger
from batchserve.core.records import command_message
from batchserve.core.settings import Settings
from batchserve.core.store import ActiveJob, JobStore
from batchserve.models.registry import Registry

log = get_logger("batchserve.jobs")

J = JobStatus


@dataclass(frozen=True, slots=True)
class JobDriverConfig:
    tick_s: float = 0.5
    lease_s: float = 30.0
    ingest_chunk: int = 5000

    @classmethod
    def from_settings(cls, settings: Settings) -> JobDriverConfig:
        return cls(ingest_chunk=settings.batch_ingest_chunk)


class JobDriver:
    def __init__(
        self,
        *,
        store: JobStore,
        queue: RequestQueue,
        registry: Registry,
        settings: Settings,
        config: JobDriverConfig | None = None,
        clock: Callable[[], float] = deployment_time,
        events: EventBus | None = None,
    ) -> None:
        self._store = store
        self._events = events
        # One per loop: a job created wakes the ingest, one cancelled the settling.
        self._wakes = (asyncio.Event(), asyncio.Event())
        self._queue = queue
        self._registry = registry
        self._settings = settings
        self.config = config or JobDriverConfig.from_settings(settings)
        self._clock = clock

    async def run(self, *, poll: bool = True) -> None:
        """Move jobs along until cancelled: each loop steps when woken (a job announced, or
        :meth:`poke`) and, with ``poll``, every ``tick_s`` besides; without it the caller's
        own probe pokes it (maintenance does, every tick)."""
        log.info("job_driver_started", tick_s=round(self.config.tick_s, 2) if poll else None)
        timeout_s = self.config.tick_s if poll else None
        subscription = (
            self._events.subscribe(self._on_event, on_reconnect=self._wake_all, topics=(JOBS,))
            if self._events is not None
            else None
        )
        try:
            await asyncio.gather(
                self._forever(self.ingest_once, self._wakes[0], timeout_s),
                self._forever(self.settle, self._wakes[1], timeout_s),
            )
        finally:
            if subscription is not None:
                await subscription.close()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, JobChanged):
            self._wake_all()

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.set()

    def poke(self, *, ingest: bool, settle: bool) -> None:
        """Wake the loops that have work: a job waits to be ingested, or one has not ended."""
        if ingest:
            self._wakes[0].set()
        if settle:
            self._wakes[1].set()

    async def _forever(
        self, step: Callable[[float], Awaitable[int]], wake: asyncio.Event, timeout_s: float | None
    ) -> None:
        while True:
            wake.clear()  # before the step: a wake-up during it is not lost
            done = 0
            try:
                done = await step(self._clock())
            except Unavailable as error:
                log.warning("job_driver_backoff", error=error)
            except Exception:
                log.exception("job_driver_step_failed", step=step.__name__)
            if not done:
                # A tick or a poke, or sooner when the API announces a job (the event is a
                # hint: the tick or the poke finds what a missed one would have said).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=timeout_s)

    # -- ingest ------------------------------------------------------------------------------

    async def ingest_once(self, now: float) -> int:
        """Lease one validating job and ingest it; 1 if there was one."""
        claim = await self._store.claim_ingest(now, lease_s=self.config.lease_s)
        if claim is None:
            return 0
        await self.ingest(claim)
        return 1

    async def ingest(self, claim: IngestClaim) -> None:
        """Validate the job's file a chunk at a time, writing each valid chunk while the next
        is checked (unpublished: a bad line further on refuses the file whole, and the job's
        rows go with it); once the whole file is valid, publish and start the job."""
        content = await self._store.file_content(claim.input_file_id, claim.tenant)
        started = self._clock()
        validation = FileValidation(
            content or b"",
            claim=claim,
            registry=self._registry,
            settings=self._settings,
            now=from_epoch(started),
        )
        over = None
        if claim.ingested_lines == 0 and not validation.errors:
            over = await self._over_bulk_quota(claim.tenant, validation.lines)
        commands: list[SubmitCommand] = []
        writing: asyncio.Task[bool] | None = None
        try:
            while not validation.done:
                # The check runs in a thread, so the loop writes the chunk before meanwhile.
                chunk = await asyncio.to_thread(validation.next_chunk, self.config.ingest_chunk)
                if writing is not None and not await writing:
                    log.info("job_ingest_stopped", job_id=claim.job_id, at=len(commands))
                    return
                writing = None
                first = len(commands)
                commands += chunk
                start = max(first, claim.ingested_lines)  # resumed: the lines before are written
                if over is None and start < len(commands):
                    writing = asyncio.create_task(self._write(claim, commands[start:], start))
            if writing is not None and not await writing:
                log.info("job_ingest_stopped", job_id=claim.job_id, at=len(commands))
                return
            writing = None
        finally:
            if writing is not None and not writing.done():  # failed in between: roll it back
                writing.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writing
        refused = validation.errors or ([over] if over is not None else [])
        if refused:
            failed = await self._store.fail_job(claim, refused, self._clock())
            log.info("job_refused", job_id=claim.job_id, errors=len(refused), held=failed)
            return
        unconfirmed = commands[claim.published_lines :]
        if not await self._publish(claim, unconfirmed, len(commands)):
            log.info("job_ingest_stopped", job_id=claim.job_id, at=len(commands))
            return
        now = self._clock()
        started_ok = await self._store.start_job(
            claim, total=len(commands), model=validation.model, now=now
        )
        log.info(
            "job_ingested",
            job_id=claim.job_id,
            requests=len(commands),
            resumed_at=claim.ingested_lines,
            seconds=round(now - started, 2),
            started=started_ok,
        )

    async def _over_bulk_quota(self, tenant: str, requests: int) -> LineError | None:
        row = await self._store.get_tenant(tenant)
        limit = (row.max_bulk_in_flight if row else None) or (
            self._settings.tenant_max_bulk_in_flight
        )
        in_flight = await self._store.bulk_in_flight(tenant)
        if in_flight + requests <= limit:
            return None
        return LineError(
            "quota_exceeded",
            f"this job's {requests} requests and the {in_flight} bulk requests in flight "
            f"exceed the tenant's limit of {limit} (max_bulk_in_flight)",
        )

    async def _write(self, claim: IngestClaim, chunk: Sequence[SubmitCommand], at: int) -> bool:
        """Commit one chunk (not yet published); False when the claim no longer holds the job."""
        return await self._store.ingest_chunk(
            claim, chunk, start=at, now=self._clock(), lease_s=self.config.lease_s
        )

    async def _publish(
        self, claim: IngestClaim, commands: Sequence[SubmitCommand], through: int
    ) -> bool:
        """Publish committed requests (packs of them, one confirmed round) and record that the
        job's lines up to ``through`` are on the broker; False when the broker did not confirm
        (the job's lease then runs out, and the next driver publishes them again)."""
        try:
            await self._queue.publish([command_message(c) for c in commands])
        except Unavailable as error:
            log.warning("job_publish_failed", job_id=claim.job_id, error=error)
            return False
        return await self._store.published_through(claim, through, self._clock())

    # -- settle ------------------------------------------------------------------------------

    async def settle(self, now: float) -> int:
        """One pass over the jobs not yet ended; how many moved."""
        moved = 0
        for job in await self._store.active_jobs():
            moved += await self._settle_one(job, now)
        return moved

    async def _settle_one(self, job: ActiveJob, now: float) -> int:
        if job.status is J.CANCELLING:
            return await self._end(job, RequestState.CANCELLED, J.CANCELLED, now)
        if job.status in (J.IN_PROGRESS, J.FINALIZING):
            if job.status is J.IN_PROGRESS and not await self._store.mark_finalizing(job.id, now):
                if job.expires_at <= from_epoch(now):
                    return await self._end(job, RequestState.EXPIRED, J.EXPIRED, now)
                return 0
            return await self._finish(job, (J.FINALIZING,), J.COMPLETED, now)
        if job.status is J.VALIDATING and job.expires_at <= from_epoch(now):
            return await self._end(job, RequestState.EXPIRED, J.EXPIRED, now)
        return 0

    async def _end(self, job: ActiveJob, state: RequestState, ending: JobStatus, now: float) -> int:
        """Expire or cancel the job's unfinished requests, then end the job if none is left."""
        code = ErrorCode.BATCH_CANCELLED if ending is J.CANCELLED else ErrorCode.BATCH_EXPIRED
        message = (
            "the batch was cancelled"
            if ending is J.CANCELLED
            else "the batch's completion window ended before this request ran"
        )
        while ended := await self._store.end_job_requests(
            job.id, state, code=code.value, message=message, now=now
        ):
            log.info("job_requests_ended", job_id=job.id, state=state, count=len(ended))
        return await self._finish(job, (job.status,), ending, now)

    async def _finish(
        self, job: ActiveJob, from_statuses: tuple[JobStatus, ...], ending: JobStatus, now: float
    ) -> int:
        done = await self._store.finish_job(
            job.id, from_statuses=from_statuses, to_status=ending, now=now, render=render_files
        )
        if done:
            log.info("job_ended", job_id=job.id, status=ending.value)
        return int(done)
