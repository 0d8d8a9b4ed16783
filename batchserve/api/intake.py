"""One door for every single submit (native and OpenAI routes): quotas, backlog bound and
deadline, then admission. A retry of a request already accepted gets its original answer,
never a refusal, whatever the load is now."""

from __future__ import annotations

from batchserve.api.deadlines import refuse_if_hopeless
from batchserve.api.quotas import Reservation
from batchserve.api.services import ApiServices
from batchserve.core.domain import RequestRecord, SubmitCommand, to_epoch
from batchserve.core.errors import Overloaded
from batchserve.core.store import Admission, TenantRow


async def admit(services: ApiServices, caller: TenantRow, command: SubmitCommand) -> Admission:
    now = to_epoch(command.created_at)
    recent = services.recent_admissions
    # On the clock the batcher's snapshots are stamped with, at full precision: created_at
    # keeps microseconds, and a request stamped just below a snapshot of the same instant was
    # taken for one the snapshot had counted.
    checked_at = services.clock()
    quotas = services.quotas
    reservation: Reservation | None = None
    try:
        reservation = await quotas.check(caller, command, now)
        await refuse_if_hopeless(services.adapters.loadboard, command, checked_at, recent)
    except BaseException as error:
        if reservation is not None:
            quotas.release(reservation)
        if not isinstance(error, Overloaded):
            raise
        original = await _original(services, command)
        if original is None:
            raise
        return Admission(record=original, replayed=True, message=None)
    # Remembered before the commit, so the end of the request cannot be announced unheard.
    request_id = str(command.id)
    services.waiters.expect(request_id, command.tenant)
    try:
        admission = await services.admitter.submit(command)
    except BaseException:
        services.waiters.forget(request_id)
        quotas.release(reservation)
        recent.discard(command.model, command.lane, checked_at)
        raise
    if admission.replayed:
        services.waiters.forget(request_id)  # the answer is another request, not this one
        quotas.release(reservation)
        recent.discard(command.model, command.lane, checked_at)
    else:
        quotas.admitted(reservation)
    return admission


async def _original(services: ApiServices, command: SubmitCommand) -> RequestRecord | None:
    if command.idempotency_key is None:
        return None
    store = services.adapters.store
    original = await store.get_by_idempotency_key(command.tenant, command.idempotency_key)
    if original is None or original.fingerprint != command.fingerprint:
        return None
    return original
