"""Values that cross process boundaries: request states, queue and batch messages, results."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson


class RequestState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {RequestState.SUCCEEDED, RequestState.FAILED, RequestState.CANCELLED, RequestState.EXPIRED}
)


class Lane(StrEnum):
    INTERACTIVE = "interactive"
    BULK = "bulk"


class BatchOutcome(StrEnum):
    SUCCEEDED = "succeeded"  # every live item has a result (some may be per-item failures)
    CRASHED = "crashed"  # the worker died or stalled past its lease; members were requeued
    ABANDONED = "abandoned"  # dispatched but never started; members were requeued
    CANCELLED = "cancelled"  # nothing left to run when it started


class ErrorCode(StrEnum):
    POISON = "poison"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_ERROR = "model_error"
    CANCELLED = "cancelled"
    BATCH_EXPIRED = "batch_expired"  # the bulk job's completion window passed first
    BATCH_CANCELLED = "batch_cancelled"  # the bulk job was cancelled first


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_epoch(value: datetime) -> float:
    if value.tzinfo is None:  # SQLite hands back naive datetimes; we only ever store UTC
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def from_epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


@dataclass(frozen=True, slots=True)
class SubmitCommand:
    """A validated request, ready to persist."""

    id: uuid.UUID
    tenant: str
    model: str
    lane: Lane
    input: str | None
    messages: list[dict[str, Any]] | None
    params: dict[str, Any]
    created_at: datetime
    deadline: datetime
    prompt_tokens: int
    max_tokens: int
    idempotency_key: str | None = None
    fingerprint: str | None = None
    webhook_url: str | None = None
    metadata: dict[str, str] | None = None
    # Set for the requests of a bulk job: the job, the line's custom_id, its line number.
    job_id: uuid.UUID | None = None
    custom_id: str | None = None
    job_line: int | None = None


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """What travels on ``requests.<model>``: enough for the batcher to decide without a query."""

    id: str
    model: str
    lane: Lane
    tenant: str
    created_at: float
    deadline: float
    prompt_tokens: int
    max_tokens: int
    group: str | None = None
    # The batch whose join box the API offered it to as it was admitted (``BatchJoinable``):
    # the batcher settles it with that batch instead of batching it.
    joined: str | None = None

    def as_dict(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "model": self.model,
            "lane": self.lane.value,
            "tenant": self.tenant,
            "created_at": self.created_at,
            "deadline": self.deadline,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "group": self.group,
        }
        if self.joined is not None:
            data["joined"] = self.joined
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueMessage:
        return cls(
            id=data["id"],
            model=data["model"],
            lane=Lane(data["lane"]),
            tenant=data["tenant"],
            created_at=float(data["created_at"]),
            deadline=float(data["deadline"]),
            prompt_tokens=int(data["prompt_tokens"]),
            max_tokens=int(data["max_tokens"]),
            group=data.get("group"),
            joined=data.get("joined"),
        )

    def encode(self) -> bytes:
        return orjson.dumps(self.as_dict())

    @classmethod
    def decode(cls, body: bytes) -> QueueMessage:
        return cls.from_dict(orjson.loads(body))

    @staticmethod
    def encode_pack(messages: Sequence[QueueMessage]) -> bytes:
        """Several requests in one body (a JSON array): how the bulk lane travels."""
        return orjson.dumps([m.as_dict() for m in messages])

    @classmethod
    def decode_any(cls, body: bytes) -> list[QueueMessage]:
        """The requests in a body, whether it holds one (an object) or a pack (an array)."""
        data = orjson.loads(body)
        if isinstance(data, list):
            return [cls.from_dict(item) for item in data]
        return [cls.from_dict(data)]


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One request inside a batch, as the worker runs it."""

    request_id: str
    input: str | None
    messages: list[dict[str, Any]] | None
    params: dict[str, Any]
    created_at: float
    received_at: float  # when the batcher first saw it
    # For engine workers, which run each request on its own: past its deadline a running
    # request is expired; generating for longer than its time limit (counted from its first
    # token: before it, it waits on other sequences' prompts) it is stopped.
    deadline: float | None = None
    time_limit_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "input": self.input,
            "messages": self.messages,
            "params": self.params,
            "created_at": self.created_at,
            "received_at": self.received_at,
            "deadline": self.deadline,
            "time_limit_s": self.time_limit_s,
        }


@dataclass(frozen=True, slots=True)
class BatchMessage:
    """A batch handed to a worker: its id fences every result it writes."""

    batch_id: str
    model: str
    dispatched_at: float
    estimated_s: float
    items: tuple[BatchItem, ...]
    # Sent behind a running batch with room: requests that arrive before its model starts may
    # join it (``batchserve/core/joins.py``).
    joinable: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "model": self.model,
            "dispatched_at": self.dispatched_at,
            "estimated_s": self.estimated_s,
            "items": [item.as_dict() for item in self.items],
            "joinable": self.joinable,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchMessage:
        return cls(
            batch_id=data["batch_id"],
            model=data["model"],
            dispatched_at=float(data["dispatched_at"]),
            estimated_s=float(data["estimated_s"]),
            items=tuple(BatchItem(**item) for item in data["items"]),
            joinable=bool(data.get("joinable", False)),
        )


@dataclass(frozen=True, slots=True)
class ItemResult:
    """A model's answer for one request, or the error that request alone earned."""

    request_id: str
    output: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_code is None


@dataclass(frozen=True, slots=True)
class Timings:
    queued_ms: float
    batch_wait_ms: float
    model_ms: float
    total_ms: float
    ttft_ms: float | None = None  # acceptance to the first token (a batch model: the answer)


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A request as the API shows it."""

    id: uuid.UUID
    tenant: str
    model: str
    lane: Lane
    state: RequestState
    created_at: datetime
    deadline: datetime
    attempts: int
    batch_id: uuid.UUID | None
    finished_at: datetime | None
    output: str | None
    finish_reason: str | None
    error_code: str | None
    error_message: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    timings: Timings | None
    metadata: dict[str, str] | None
    idempotency_key: str | None = None
    fingerprint: str | None = None
    webhook_url: str | None = None


def record_from_wire(wire: dict[str, Any]) -> RequestRecord:
    """The record a change's ``records`` carried (orjson wrote it: :meth:`StateChange.encode`)."""
    values = dict(wire)
    for name in ("id", "batch_id"):
        if values[name] is not None:
            values[name] = uuid.UUID(values[name])
    for name in ("created_at", "deadline", "finished_at"):
        if values[name] is not None:
            values[name] = datetime.fromisoformat(values[name])
    values["lane"] = Lane(values["lane"])
    values["state"] = RequestState(values["state"])
    if values["timings"] is not None:
        values["timings"] = Timings(**values["timings"])
    return RequestRecord(**values)


@dataclass(frozen=True, slots=True)
class StateChange:
    """Published after commit whenever requests change state, to wake long-polls.

    ``records``: where the writer read them back in the same statement, the requests as they
    are now (a batch's results), so a long-poll answers from the notification without reading
    them again; a hint like the rest, never the only copy. A change decoded from the wire
    holds them as they came (``carried``): every subscriber decodes every change, and only
    one with a waiter makes the records it needs (:meth:`records_for`)."""

    request_ids: tuple[str, ...]
    state: RequestState
    batch_id: str | None = None
    model: str | None = None
    records: tuple[RequestRecord, ...] = ()
    carried: tuple[dict[str, Any], ...] = field(default=(), compare=False, repr=False)

    def encode(self) -> dict[str, Any]:
        encoded: dict[str, Any] = {
            "type": "state",
            "ids": list(self.request_ids),
            "state": self.state.value,
            "batch_id": self.batch_id,
            "model": self.model,
        }
        if self.records or self.carried:
            # orjson writes the records itself, in C: each field by name, uuids as strings,
            # times in ISO 8601 with their offset, enums by value (what record_from_wire reads).
            encoded["records"] = list(self.records) or list(self.carried)
        return encoded

    def records_for(self, request_ids: Iterable[str]) -> dict[str, RequestRecord]:
        """The records this change carries of ``request_ids``, by id."""
        wanted = set(request_ids)
        found = {str(r.id): r for r in self.records if str(r.id) in wanted}
        for wire in self.carried:
            if wire["id"] in wanted:
                found[wire["id"]] = record_from_wire(wire)
        return found


@dataclass(frozen=True, slots=True)
class BatchClosed:
    """Published when a batch ends, however it ends: its slot is free again."""

    model: str
    batch_id: str
    outcome: str
    worker: str | None = None
    # How early the batch came to its slot: seconds it waited there for the running model
    # (positive) or minus the seconds the slot stood idle first; None where not measured.
    early_s: float | None = None

    def encode(self) -> dict[str, Any]:
        return {
            "type": "batch",
            "model": self.model,
            "batch_id": self.batch_id,
            "outcome": self.outcome,
            "worker": self.worker,
            "early_s": self.early_s,
        }


@dataclass(frozen=True, slots=True)
class BatchJoinable:
    """Published when a batch is sent behind a running one with room: until its model starts,
    the API may offer it the requests it admits (``batchserve/core/joins.py``), those that
    fit: ``max_tokens`` in (``above``, ``upto``], a deadline that allows ``ends_by``, and
    only while the batch has no token budget to keep."""

    model: str
    batch_id: str
    room: int  # the box's capacity: the most that may join, whoever offers them
    starts_by: float  # its slot's running batch is expected to end by then
    ends_by: float
    above: int = 0
    upto: int | None = None
    budgeted: bool = False

    def encode(self) -> dict[str, Any]:
        return {
            "type": "joinable",
            "model": self.model,
            "batch_id": self.batch_id,
            "room": self.room,
            "starts_by": self.starts_by,
            "ends_by": self.ends_by,
            "above": self.above,
            "upto": self.upto,
            "budgeted": self.budgeted,
        }

    def takes(self, message: QueueMessage) -> bool:
        """Whether ``message`` may join this batch (as the batcher's own joiners must)."""
        return (
            not self.budgeted
            and message.group is None
            and message.model == self.model
            and message.deadline >= self.ends_by
            and self.above < message.max_tokens
            and (self.upto is None or message.max_tokens <= self.upto)
        )


@dataclass(frozen=True, slots=True)
class SequencesFreed:
    """Published by an engine worker when sequences of a batch leave its engine (finished,
    cancelled or expired): the batcher may fill their room at once."""

    model: str
    batch_id: str
    request_ids: tuple[str, ...]

    def encode(self) -> dict[str, Any]:
        return {
            "type": "freed",
            "model": self.model,
            "batch_id": self.batch_id,
            "ids": list(self.request_ids),
        }


@dataclass(frozen=True, slots=True)
class JobChanged:
    """Published when a bulk job is created or cancelled: the job driver acts on it at once
    rather than at its next tick."""

    job_id: str
    status: str

    def encode(self) -> dict[str, Any]:
        return {"type": "job", "job_id": self.job_id, "status": self.status}


@dataclass(frozen=True, slots=True)
class KeyRevoked:
    """Published when an API key is revoked: every API replica forgets its cached lookup at
    once instead of trusting it for up to ``key_cache_s``."""

    key_id: str

    def encode(self) -> dict[str, Any]:
        return {"type": "key_revoked", "key_id": self.key_id}


Event = StateChange | BatchClosed | BatchJoinable | SequencesFreed | JobChanged | KeyRevoked


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # an attempt is due, in flight, or scheduled
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # attempts spent, endpoint gone or disabled, or the URL was refused


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One HTTP attempt of a webhook delivery."""

    number: int
    started_at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float | None
    address: str | None


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """A webhook delivery as the API shows it; ``id`` is the ``webhook-id`` header."""

    id: str
    request_id: uuid.UUID | None  # None for a bulk job's delivery (``job_id``)
    tenant: str
    url: str
    event_type: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    error: str | None = None
    attempt_log: tuple[AttemptRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """A due delivery the relay leased: whoever holds ``token`` may make the next attempt."""

    id: str
    token: str


@dataclass(frozen=True, slots=True)
class DeliveryStart:
    """What an attempt needs, once its sender holds the lease (``token`` is the fresh one)."""

    id: str
    token: str
    number: int  # this attempt's number, counting every attempt ever made
    run_attempts: int  # attempts in the current run of the retry schedule, this one included
    request_id: uuid.UUID | None
    tenant: str
    url: str
    event_type: str
    created_at: datetime
    job_id: uuid.UUID | None = None  # the subject of ``batch.*`` events


def encode_event(event: Event) -> bytes:
    return orjson.dumps(event.encode())


def decode_event(body: bytes | str) -> Event:
    data = orjson.loads(body)
    if data["type"] == "job":
        return JobChanged(job_id=data["job_id"], status=data["status"])
    if data["type"] == "key_revoked":
        return KeyRevoked(key_id=data["key_id"])
    if data["type"] == "freed":
        return SequencesFreed(
            model=data["model"], batch_id=data["batch_id"], request_ids=tuple(data["ids"])
        )
    if data["type"] == "joinable":
        return BatchJoinable(
            model=data["model"],
            batch_id=data["batch_id"],
            room=int(data["room"]),
            starts_by=float(data["starts_by"]),
            ends_by=float(data["ends_by"]),
            above=int(data["above"]),
            upto=data["upto"],
            budgeted=bool(data["budgeted"]),
        )
    if data["type"] == "batch":
        return BatchClosed(
            model=data["model"],
            batch_id=data["batch_id"],
            outcome=data["outcome"],
            worker=data.get("worker"),
            early_s=data.get("early_s"),
        )
    return StateChange(
        request_ids=tuple(data["ids"]),
        state=RequestState(data["state"]),
        batch_id=data.get("batch_id"),
        model=data.get("model"),
        carried=tuple(data.get("records", ())),
    )
