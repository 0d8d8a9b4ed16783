"""What maintenance has to do now: one read a tick instead of a statement for each of its tasks.

An idle deployment's maintenance used to spend a transaction a tick on each task (expired
leases, overdue requests, unpublished requests, bulk jobs to ingest, bulk jobs to settle), four
to five a tick whether or not there was anything to do. :meth:`DueVerbs.due` asks all of them
at once, in one autocommit round trip of ``EXISTS`` probes on the same conditions the verbs
act on (each has a partial or leading-column index), and maintenance runs only the tasks it
names.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass

from sqlalchemy import exists, select

from batchserve.core.db import autocommit
from batchserve.core.store.base import StoreBase
from batchserve.core.store.batches import lease_expired
from batchserve.core.store.ingest import ingest_waiting
from batchserve.core.store.requests import deadline_passed, never_published
from batchserve.core.store.settle import job_not_ended


@dataclass(frozen=True, slots=True)
class Due:
    leases: bool = False  # a batch's lease ran out: reap it
    overdue: bool = False  # a queued request's deadline passed: expire it
    unpublished: bool = False  # a request committed a while ago never reached the broker
    ingest: bool = False  # a bulk job waits for a driver to ingest its file
    jobs: bool = False  # a bulk job has not ended: the driver settles it

    def __bool__(self) -> bool:
        return any(astuple(self))


class DueVerbs(StoreBase):
    async def due(self, now: float, *, unpublished_before: float) -> Due:
        """Which of maintenance's tasks have work at ``now``."""
        probes = select(
            exists().where(*lease_expired(now)),
            exists().where(*deadline_passed(now)),
            exists().where(*never_published(unpublished_before)),
            exists().where(*ingest_waiting(now)),
            exists().where(job_not_ended()),
        )
        async with autocommit(self.engine) as conn:
            row = (await conn.execute(probes)).one()
        return Due(*(bool(value) for value in row))
