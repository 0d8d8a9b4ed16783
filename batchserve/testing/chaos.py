"""``batchserve chaos``: traffic plus a schedule of faults against a local deployment, then an
audit of every accepted request's fate.

The audit reads Postgres, the source of truth: ``lost`` = accepted (a 202 reached the client)
but no row; ``stuck`` = not terminal once the system had time to recover; ``duplicated`` = more
than one terminal transition logged, or a terminal row whose log disagrees with it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import create_engine, text

from batchserve.core.migrate import sync_url

TERMINAL = ("succeeded", "failed", "cancelled", "expired")


@dataclass
class FaultRecord:
    name: str
    at: float
    recovery_s: float | None = None


@dataclass
class ChaosReport:
    accepted: int = 0
    refused: int = 0
    succeeded: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    expired: int = 0
    lost: int = 0
    duplicated: int = 0
    stuck: int = 0
    max_recovery_s: float = 0.0
    faults: list[FaultRecord] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.stuck == 0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["clean"] = self.clean
        return data

    def lines(self) -> list[str]:
        failed = ", ".join(f"{code}: {n}" for code, n in sorted(self.failed.items())) or "none"
        lines = [
            f"accepted    {self.accepted}  (refused at admission: {self.refused})",
            f"succeeded   {self.succeeded}",
            f"failed      {sum(self.failed.values())}  ({failed})",
            f"cancelled   {self.cancelled}",
            f"expired     {self.expired}",
            f"lost        {self.lost}",
            f"duplicated  {self.duplicated}",
            f"stuck       {self.stuck}",
            f"max_recovery_s {self.max_recovery_s:.2f}",
        ]
        for fault in self.faults:
            recovery = "-" if fault.recovery_s is None else f"{fault.recovery_s:.2f} s"
            lines.append(f"  fault {fault.name:<24} recovery {recovery}")
        return lines


def states(database_url: str, ids: Sequence[str]) -> dict[str, tuple[str, str | None]]:
    engine = create_engine(sync_url(database_url))
    found: dict[str, tuple[str, str | None]] = {}
    try:
        with engine.connect() as conn:
            for start in range(0, len(ids), 5000):
                chunk = [uuid.UUID(i) for i in ids[start : start + 5000]]
                rows = conn.execute(
                    text("SELECT id, state, error_code FROM requests WHERE id = ANY(:ids)"),
                    {"ids": chunk},
                )
                found.update({str(r[0]): (r[1], r[2]) for r in rows})
    finally:
        engine.dispose()
    return found


async def wait_settled(
    database_url: str, ids: Sequence[str], timeout_s: float, poll_s: float = 1.0
) -> float:
    """Wait until every request in ``ids`` is terminal (or gone); returns the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        found = await asyncio.to_thread(states, database_url, ids)
        if all(state in TERMINAL for state, _ in found.values()):
            break
        await asyncio.sleep(poll_s)
    return time.monotonic() - started


def audit(
    database_url: str,
    accepted: Sequence[str],
    *,
    refused: int = 0,
    faults: Sequence[FaultRecord] = (),
) -> ChaosReport:
    report = ChaosReport(accepted=len(accepted), refused=refused, faults=list(faults))
    found = states(database_url, accepted)
    report.lost = len(set(accepted) - found.keys())
    failed: Counter[str] = Counter()
    for state, code in found.values():
        if state == "succeeded":
            report.succeeded += 1
        elif state == "failed":
            failed[code or "unknown"] += 1
        elif state == "cancelled":
            report.cancelled += 1
        elif state == "expired":
            report.expired += 1
        else:
            report.stuck += 1
    report.failed = dict(failed)
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as conn:
            report.duplicated = _duplicated(conn)
            for fault in report.faults:
                fault.recovery_s = _recovery_s(conn, fault.at)
    finally:
        engine.dispose()
    recoveries = [f.recovery_s for f in report.faults if f.recovery_s is not None]
    report.max_recovery_s = max(recoveries, default=0.0)
    return report


def _duplicated(conn: Any) -> int:
    """Requests with more than one terminal transition, or whose row disagrees with its log."""
    twice = conn.execute(
        text(
            "SELECT count(*) FROM (SELECT request_id FROM request_events "
            "GROUP BY request_id HAVING count(*) > 1) t"
        )
    ).scalar_one()
    disagree = conn.execute(
        text(
            "SELECT count(*) FROM requests r WHERE r.state IN "
            "('succeeded','failed','cancelled','expired') AND NOT EXISTS "
            "(SELECT 1 FROM request_events e WHERE e.request_id = r.id AND e.state = r.state)"
        )
    ).scalar_one()
    return int(twice) + int(disagree)


def _recovery_s(conn: Any, fault_at: float) -> float | None:
    """From the fault until a request submitted after it succeeded: time to restore service."""
    first = conn.execute(
        text(
            "SELECT min(extract(epoch FROM finished_at)) FROM requests "
            "WHERE state = 'succeeded' AND created_at > to_timestamp(:at)"
        ),
        {"at": fault_at},
    ).scalar_one()
    return None if first is None else round(float(first) - fault_at, 3)


# -- the traffic ---------------------------------------------------------------------------


def traffic_body(model: str, rng_seed: int) -> Callable[[int], dict[str, Any]]:
    """Mostly plain requests; one in twenty with a short deadline (some expire or are refused)."""

    def make(index: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "input": f"chaos {rng_seed} {index}"}
        if index % 20 == 7:
            body["timeout_s"] = 0.5
        return body

    return make


def new_run_name() -> str:
    return f"chaos{secrets.token_hex(3)}"


# -- the run ---------------------------------------------------------------------------------


@dataclass
class ChaosPlan:
    duration_s: float
    rate: float
    model: str = "echo-100ms"
    slots: int = 1
    server_faults: bool = True
    seed: int = 1


def fault_schedule(plan: ChaosPlan) -> list[tuple[float, str]]:
    """Faults spread evenly over the run, leaving the last sixth for recovery."""
    names = [
        "kill-worker-pool-process",
        "kill-api",
        "freeze-worker",
        "kill-active-batcher",
        "kill-worker",
    ]
    if plan.server_faults:
        names[3:3] = ["restart-redis"]
        names += ["restart-rabbitmq", "restart-postgres"]
    start, end = 0.08 * plan.duration_s, 0.8 * plan.duration_s
    step = (end - start) / max(1, len(names) - 1)
    return [(start + i * step, name) for i, name in enumerate(names)]
