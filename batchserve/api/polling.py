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

    Subscribed before the read, so one read serves: a change after it wakes the wait. A wait
    for the end of a request this process admitted, whose end has not been announced since,
    reads nothing until the announcement (which mostly carries the request) or the wait's end.
    """
    key = str(request_id)
    with services.waiters.watch(key, terminal_only=until == "terminal") as changed:
        if until == "terminal" and services.waiters.unfinished(key, tenant):
            return await _wait(services, request_id, None, tenant, wait_s, until, changed)
        first = await read_request(services, request_id, tenant)
        return await _wait(services, first.id, first, tenant, wait_s, until, changed)


async def long_poll(
    services: ApiServices, first: RequestRecord, tenant: str, wait_s: float, until: str
) -> RequestRecord:
    """Wait for a notification that the request changed, re-reading Postgres on each."""
    with services.waiters.watch(str(first.id), terminal_only=until == "terminal") as changed:
        # Read again once subscribed, so a change between the first read and now is not missed.
        record = await read_request(services, first.id, tenant)
        return await _wait(services, first.id, record, tenant, wait_s, until, changed, first)


async def wait_from(
    services: ApiServices,
    record: RequestRecord,
    tenant: str,
    wait_s: float,
    changed: Wake,
) -> RequestRecord:
    """Wait for the end of a request read (or admitted) after ``changed`` began watching it:
    nothing to read again until a notification comes."""
    return await _wait(services, record.id, record, tenant, wait_s, "terminal", changed)


async def _wait(
    services: ApiServices,
    request_id: uuid.UUID,
    record: RequestRecord | None,
    tenant: str,
    wait_s: float,
    until: str,
    changed: Wake,
    first: RequestRecord | None = None,
) -> RequestRecord:
    """``record``: the request as last read (None: known not to have ended, not read);
    ``first``: the state a change is counted from (default ``record``)."""
    waiters = services.waiters
    first = first or record
    give_up_at = time.monotonic() + wait_s
    while record is None or not _done(record, first, until):
        remaining = give_up_at - time.monotonic()
        if remaining <= 0:
            break
        poll_s = waiters.poll_s
        timeout = remaining if poll_s is None else min(remaining, poll_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=timeout)
        changed.clear()
        carried = changed.take_record()
        if carried is not None and carried.id == request_id and carried.tenant == tenant:
            record = carried  # the notification brought it as committed: no read
        else:
            record = await read_request(services, request_id, tenant)
    if record is None:  # waited out without a notification: answer as it stands
        record = await read_request(services, request_id, tenant)
    return record


def _done(record: RequestRecord, first: RequestRecord | None, until: str) -> bool:
    if record.state.terminal:
        return True
    return until == "change" and first is not None and record.state is not first.state
