"""Waiting for a request's state to change: the long-poll behind ``?wait=`` and the OpenAI
synchronous endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from batchserve.api.services import ApiServices
from batchserve.api.waiters import Wake
from batchserve.core.domain import RequestRecord
from batchserve.core.errors import NotFound


async def read_request(services: ApiServices, request_id: uuid.UUID, tenant: str) -> RequestRecord:
    record = await services.adapters.store.get(request_id, tenant)
    if record is None:
        raise NotFound(f"no request {request_id}")
    return record


async def read_or_wait(
    services: ApiServices, request_id: uuid.UUID, tenant: str, wait_s: float, until: str
) -> RequestRecord:
    """The request, after waiting up to ``wait_s`` for it to be done (``until``) if it is not.

    Subscribed before the read, so one read serves: a change after it wakes the wait."""
    with services.waiters.watch(str(request_id), terminal_only=until == "terminal") as changed:
        first = await read_request(services, request_id, tenant)
        return await _wait(services, first, first, tenant, wait_s, until, changed)


async def long_poll(
    services: ApiServices, first: RequestRecord, tenant: str, wait_s: float, until: str
) -> RequestRecord:
    """Wait for a notification that the request changed, re-reading Postgres on each."""
    with services.waiters.watch(str(first.id), terminal_only=until == "terminal") as changed:
        # Read again once subscribed, so a change between the first read and now is not missed.
        record = await read_request(services, first.id, tenant)
        return await _wait(services, first, record, tenant, wait_s, until, changed)


async def wait_from(
    services: ApiServices,
    record: RequestRecord,
    tenant: str,
    wait_s: float,
    changed: Wake,
) -> RequestRecord:
    """Wait for the end of a request read (or admitted) after ``changed`` began watching it:
    nothing to read again until a notification comes."""
    return await _wait(services, record, record, tenant, wait_s, "terminal", changed)


async def _wait(
    services: ApiServices,
    first: RequestRecord,
    record: RequestRecord,
    tenant: str,
    wait_s: float,
    until: str,
    changed: Wake,
) -> RequestRecord:
    waiters = services.waiters
    give_up_at = time.monotonic() + wait_s
    while not _done(record, first, until):
        remaining = give_up_at - time.monotonic()
        if remaining <= 0:
            break
        poll_s = waiters.poll_s
        timeout = remaining if poll_s is None else min(remaining, poll_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=timeout)
        changed.clear()
        carried = changed.take_record()
        if carried is not None and carried.id == first.id and carried.tenant == tenant:
            record = carried  # the notification brought it as committed: no read
        else:
            record = await read_request(services, first.id, tenant)
    return record


def _done(record: RequestRecord, first: RequestRecord, until: str) -> bool:
    if record.state.terminal:
        return True
    return until == "change" and record.state is not first.state
