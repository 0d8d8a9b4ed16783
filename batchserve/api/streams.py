"""A request's stream: its state changes and token deltas, from the token log, ending with the
stored result.

What a client assembles from a stream (the text of its ``delta`` events, started over at each
``reset``) is the answer of the run that counts, and at the end it equals the stored result
exactly: a request retried after its worker died runs again under a new batch, and the stream
starts its text over (``reset``) when the new run begins, ignoring whatever the old run still
writes. The end is read from Postgres, the record, and what the stream had not shown of the
stored answer (the log lost entries, Redis was down) is sent then.

Every event has an id, ``<log entry id>/<n>`` (the ``n``-th event that entry made) or
``<log entry id>/e<n>`` for the events of the end; a client that comes back with
``Last-Event-ID``, to any API replica, gets the events after it, rebuilt from the same log.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from batchserve.api.polling import long_poll, read_request
from batchserve.api.schemas import RequestOut, dump
from batchserve.api.services import ApiServices
from batchserve.core.domain import RequestRecord, RequestState
from batchserve.core.errors import InvalidInput
from batchserve.core.tokenlog import DELTA, START, TERMINAL, LogEntry, entry_key

STATE, DELTA_EVENT, RESET = "state", "delta", "reset"
WAIT_S = 5.0  # one wait on the log, between reads of the request (its end may be missed)
PING_S = 15  # a comment line this often keeps proxies from closing a quiet stream
_EVENT_ID = re.compile(r"^(\d{1,20})-(\d{1,20})/(e?)(\d{1,6})$")
# What the Last-Event-ID header may hold (blank: from the start), for the API's document.
EVENT_ID_PATTERN = r"^\s*(\d{1,20}-\d{1,20}/e?\d{1,6})?\s*$"


@dataclass(frozen=True, slots=True, order=True)
class EventId:
    """Where an event stands in a stream: after its log entry, and its place among that
    entry's events (those of the end after every entry's)."""

    entry: tuple[int, int]
    final: bool = False
    n: int = 0

    def __str__(self) -> str:
        return f"{self.entry[0]}-{self.entry[1]}/{'e' if self.final else ''}{self.n}"

    @property
    def entry_id(self) -> str:
        return f"{self.entry[0]}-{self.entry[1]}"


def parse_event_id(value: str | None) -> EventId | None:
    """A ``Last-Event-ID`` header; 400 naming it when it is not one of ours."""
    if value is None or not value.strip():
        return None
    found = _EVENT_ID.match(value.strip())
    if found is None:
        raise InvalidInput(
            "Last-Event-ID must be the id of an event of this stream, e.g. 1733100000000-0/0",
            field="Last-Event-ID",
        )
    ms, seq, final, n = found.groups()
    return EventId((int(ms), int(seq)), final == "e", int(n))


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: EventId
    event: str  # state, delta or reset
    data: dict[str, Any]
    record: RequestRecord | None = None  # the stored request, on the last event


@dataclass
class Assembler:
    """Turns log entries into a client's events, following the run that counts (pure)."""

    text: str = ""
    batch: str | None = None  # the run whose deltas count now
    superseded: set[str] = field(default_factory=set)  # runs that ended: their deltas are stale
    ended: bool = False  # a terminal state was logged: read the record
    last_entry: tuple[int, int] = (0, 0)

    def feed(self, entry_id: str, entry: LogEntry) -> list[StreamEvent]:
        key = entry_key(entry_id)
        self.last_entry = max(self.last_entry, key)
        made: list[tuple[str, dict[str, Any]]] = []
        if entry.kind == DELTA:
            if entry.batch in self.superseded or not entry.text:
                return []
            if entry.batch != self.batch:  # a run whose start we did not see
                self._new_run(entry.batch or None, made)
            self.text += entry.text
            made.append((DELTA_EVENT, {"text": entry.text}))
        else:
            state = entry.state
            if state in TERMINAL:
                self.ended = True
                return []
            if state == RequestState.RUNNING.value:
                if entry.batch in self.superseded:
                    return []
                if entry.batch != self.batch:
                    self._new_run(entry.batch or None, made)
            elif state == RequestState.QUEUED.value:  # queued again: this run is over
                self._new_run(None, made)
            data: dict[str, Any] = {"status": state}
            if entry.batch:
                data["batch_id"] = entry.batch
            made.append((STATE, data))
        return [StreamEvent(EventId(key, False, n), e, d) for n, (e, d) in enumerate(made)]

    def _new_run(self, batch: str | None, made: list[tuple[str, dict[str, Any]]]) -> None:
        if self.batch is not None:
            self.superseded.add(self.batch)
        self.batch = batch
        if self.text:
            self.text = ""
            made.append((RESET, {}))

    def finish(
        self, record: RequestRecord, *, retention_s: float, known: bool = True
    ) -> list[StreamEvent]:
        """The end, from the stored record: what the client lacks of the stored answer, then the
        terminal state with the whole request. ``known=False``: what the client holds is not
        known (its place in the log is gone), so the answer is sent over from the start."""
        made: list[tuple[str, dict[str, Any]]] = []
        output = record.output
        if output is not None:
            if known and output.startswith(self.text):
                tail = output[len(self.text) :]
            else:
                made.append((RESET, {}))
                tail = output
            if tail:
                made.append((DELTA_EVENT, {"text": tail}))
            self.text = output
        request = dump(RequestOut.of(record, retention_s=retention_s))
        made.append((STATE, {"status": record.state.value, "request": request}))
        events = [
            StreamEvent(EventId(self.last_entry, True, n), e, d) for n, (e, d) in enumerate(made)
        ]
        last = events[-1]
        events[-1] = StreamEvent(last.id, last.event, last.data, record)
        return events


def opening(record: RequestRecord) -> StreamEvent:
    """The state the request is in when a stream opens (before the log has anything)."""
    data: dict[str, Any] = {"status": record.state.value}
    if record.batch_id is not None and record.state is RequestState.RUNNING:
        data["batch_id"] = str(record.batch_id)
    return StreamEvent(EventId((0, 0)), STATE, data)


async def follow(
    services: ApiServices,
    record: RequestRecord,
    tenant: str,
    resume: EventId | None = None,
    *,
    wait_s: float = WAIT_S,
) -> AsyncIterator[StreamEvent]:
    """The request's events after ``resume`` (all of them without), until its end.

    The log is read from its start each time, so that a stream resumed anywhere rebuilds the
    same events; only those after ``resume`` are sent. ``wait_s``: how long one wait on the log
    lasts before the request is read again (its end may have missed the log)."""
    tokens = services.adapters.tokens
    request_id = str(record.id)
    assembler = Assembler()
    after = START
    stop_at = resume.entry if resume is not None and resume.final else None
    # Whether the log still holds the point the client resumes from (else: it expired, or
    # Redis lost it, and what the client holds is not known).
    reached = resume is None or resume.entry == (0, 0)
    if resume is None and not record.state.terminal:
        yield opening(record)
    terminal = record.state.terminal
    block_s = 0.0  # catch up first
    while True:
        entries = await tokens.read(request_id, after, block_s=block_s)
        if entries is None:  # the log cannot be read: the stored result will have to do
            record = await _until_terminal(services, record, tenant)
            break
        read_all = False
        if stop_at is not None:
            kept = [e for e in entries if entry_key(e[0]) <= stop_at]
            read_all, entries = len(kept) < len(entries) or not entries, kept
        for entry_id, entry in entries:
            after = entry_id
            if resume is not None and entry_key(entry_id) >= resume.entry:
                reached = True
            for event in assembler.feed(entry_id, entry):
                if resume is None or event.id > resume:
                    yield event
        if assembler.ended and not terminal:
            record = await read_request(services, record.id, tenant)
            terminal = record.state.terminal
        if read_all or (entries and stop_at is not None and assembler.last_entry >= stop_at):
            break
        if entries:
            block_s = 0.0 if terminal else wait_s  # a wait returns at once while there is more
            continue
        if terminal:
            break  # caught up with the log of a finished request
        if block_s > 0:  # waited in vain: has it ended without a word in the log?
            record = await read_request(services, record.id, tenant)
            terminal = record.state.terminal
        block_s = 0.0 if terminal else wait_s
    if not record.state.terminal:
        record = await _until_terminal(services, record, tenant)
    retention_s = services.settings.request_retention_s
    for event in assembler.finish(record, retention_s=retention_s, known=reached):
        if not reached or resume is None or event.id > resume:
            yield event


async def _until_terminal(
    services: ApiServices, record: RequestRecord, tenant: str
) -> RequestRecord:
    """Wait for the request's end through the store (long-poll wake-ups, else polling)."""
    while not record.state.terminal:
        record = await long_poll(services, record, tenant, 60.0, "terminal")
    return record
