"""The token log: a bounded, expiring log per request of what its stream shows.

Workers append a request's token deltas (one write per engine step), and the job
store appends its state changes; any API replica reads the log from an offset, so a client that
reconnects elsewhere with ``Last-Event-ID`` continues where it left off. On the servers it is a
Redis Stream per request (``XADD`` with an approximate ``MAXLEN`` cap, ``EXPIRE`` renewed as it is
written); in the embedded mode an in-memory twin with the same interface and entry ids.

Once a request has ended its log is kept only ``linger_s`` more (a minute by default), for a
client whose stream broke near the end to resume it: a new stream of a finished request ends
with the stored result either way. A Redis Stream holds about 4.8 KB however few its entries
(Redis 7.0 allocates a whole listpack node), so logs kept the full TTL after their end would
hold ~1.7 GB of Redis memory at a steady 100 requests a second; lingering, ~30 MB
(docs/operations.md, "Redis memory: the token logs").

The log is a convenience, never the record: Postgres holds the final result and is not written
per token. Writes are best effort (logged, never raised, never awaited by the engine's step),
and a reader that finds the log unreadable or gone falls back to the stored result.

Every entry names the batch whose run produced it: a request retried after its worker died runs
again under another batch, and the reader starts its text over then (see
``batchserve/api/streams.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from batchserve.core.domain import RequestState, StateChange
from batchserve.core.logs import get_logger

log = get_logger("batchserve.tokenlog")

DELTA = "delta"
STATE = "state"
START = "0-0"  # read from the beginning


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One entry: a ``delta`` of text, or a ``state`` the request reached."""

    kind: str
    batch: str = ""  # the batch whose run it belongs to ("" when none: queued again)
    text: str = ""
    state: str = ""

    @classmethod
    def delta(cls, batch_id: str, text: str) -> LogEntry:
        return cls(DELTA, batch_id, text=text)

    @classmethod
    def of_state(cls, state: str, batch_id: str | None) -> LogEntry:
        return cls(STATE, batch_id or "", state=state)

    def fields(self) -> dict[str, str]:
        if self.kind == DELTA:
            return {"k": DELTA, "b": self.batch, "t": self.text}
        return {"k": STATE, "b": self.batch, "s": self.state}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes] | dict[str, str]) -> LogEntry:
        get = {_text(k): _text(v) for k, v in fields.items()}.get
        return cls(get("k", ""), get("b", ""), text=get("t", ""), state=get("s", ""))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


Appended = Sequence[tuple[str, LogEntry]]  # (request id, entry)
Read = list[tuple[str, LogEntry]]  # (entry id, entry)


def entry_key(entry_id: str) -> tuple[int, int]:
    """An entry id (``<ms>-<seq>``, Redis's form) as a sortable pair; ``ValueError`` if not."""
    head, _, tail = entry_id.partition("-")
    ms, seq = int(head), int(tail or 0)
    if ms < 0 or seq < 0:
        raise ValueError(entry_id)
    return ms, seq


TERMINAL = frozenset(state.value for state in RequestState if state.terminal)


def ends(entry: LogEntry) -> bool:
    """Whether ``entry`` is the request's end (a terminal state)."""
    return entry.kind == STATE and entry.state in TERMINAL


def state_entries(event: StateChange) -> list[tuple[str, LogEntry]]:
    """The log entries of a committed state change, one for each of its requests."""
    entry = LogEntry.of_state(event.state.value, event.batch_id)
    return [(request_id, entry) for request_id in event.request_ids]


@dataclass(frozen=True, slots=True)
class TokenLogConfig:
    ttl_s: float = 3600.0  # a log lives this long after its last write
    linger_s: float = 60.0  # and at most this long after the request's end
    max_entries: int = 10_000  # per request (approximate on Redis)
    max_pending: int = 100_000  # entries waiting to be written; past it new ones are dropped
    retry_after_s: float = 1.0  # after a failed write, entries are dropped this long

    @property
    def kept_after_end_s(self) -> float:
        return min(self.linger_s, self.ttl_s)


class TokenLog(ABC):
    """Per request, an append-only log of entries that any reader can follow from an offset."""

    @abstractmethod
    def append(self, entries: Appended, *, create: bool = True) -> None:
        """Queue ``entries`` for writing, in order, without waiting (best effort).
        ``create=False``: only to logs that exist already (a batch model's answer, which the
        stored result repeats: it needs no log of its own, nor the expiry one would take)."""

    @abstractmethod
    async def flush(self) -> None:
        """Wait until what was appended so far is written (or given up)."""

    @abstractmethod
    async def read(
        self, request_id: str, after: str = START, *, count: int = 512, block_s: float = 0.0
    ) -> Read | None:
        """Entries after ``after``, oldest first; with ``block_s``, wait that long for one when
        there is none yet. ``None`` when the log cannot be read (Redis down)."""

    async def on_change(self, event: StateChange) -> None:
        """A store's change hook: log the states requests reach."""
        self.append(state_entries(event))

    async def close(self) -> None:
        return None


class MemoryTokenLog(TokenLog):
    """The embedded mode's log: the same ids, cap and expiry, in this process (one event loop)."""

    def __init__(
        self, config: TokenLogConfig | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config or TokenLogConfig()
        self._clock = clock
        self._logs: dict[str, collections.deque[tuple[str, LogEntry]]] = {}
        self._expires_at: dict[str, float] = {}
        self._last_id: dict[str, tuple[int, int]] = {}
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._next_sweep_at = 0.0

    def append(self, entries: Appended, *, create: bool = True) -> None:
        now = self._clock()
        self._sweep(now)
        for request_id, entry in entries:
            if self._expired(request_id, now):
                self._forget(request_id)
            entries_of = self._logs.get(request_id)
            if entries_of is None:
                if not create:
                    continue
                entries_of = self._logs[request_id] = collections.deque(
                    maxlen=self.config.max_entries
                )
            entries_of.append((self._next_id(request_id, now), entry))
            self._expires_at[request_id] = now + (
                self.config.kept_after_end_s if ends(entry) else self.config.ttl_s
            )
            for waiter in self._waiting.get(request_id, ()):
                waiter.set()

    async def flush(self) -> None:
        return None

    async def read(
        self, request_id: str, after: str = START, *, count: int = 512, block_s: float = 0.0
    ) -> Read | None:
        found = self._after(request_id, after, count)
        if found or block_s <= 0:
            return found
        waiter = asyncio.Event()
        self._waiting.setdefault(request_id, set()).add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), block_s)
        finally:
            waiting = self._waiting.get(request_id, set())
            waiting.discard(waiter)
            if not waiting:
                self._waiting.pop(request_id, None)
        return self._after(request_id, after, count)

    def _after(self, request_id: str, after: str, count: int) -> Read:
        if self._expired(request_id, self._clock()):
            self._forget(request_id)
            return []
        since = entry_key(after)
        found = [(i, e) for i, e in self._logs.get(request_id, ()) if entry_key(i) > since]
        return found[:count]

    def _next_id(self, request_id: str, now: float) -> str:
        ms = max(1, int(now * 1000))  # 0-0 is the start, before every entry
        last_ms, last_seq = self._last_id.get(request_id, (0, -1))
        key = (ms, 0) if ms > last_ms else (last_ms, last_seq + 1)
        self._last_id[request_id] = key
        return f"{key[0]}-{key[1]}"

    def _expired(self, request_id: str, now: float) -> bool:
        expires_at = self._expires_at.get(request_id)
        return expires_at is not None and expires_at <= now

    def _forget(self, request_id: str) -> None:
        self._logs.pop(request_id, None)
        self._expires_at.pop(request_id, None)
        self._last_id.pop(request_id, None)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep_at:
            return
        self._next_sweep_at = now + min(60.0, self.config.ttl_s)
        for request_id in [r for r, at in self._expires_at.items() if at <= now]:
            self._forget(request_id)


# At most this many entries a script call (Redis runs a script alone: a bulk job's thousands of
# ends at once are written a few hundred at a time).
WRITE_CHUNK = 256

# KEYS: each entry's log. ARGV[1]: one JSON document, [cap, entries, expiries]: per entry
# [1 if it may make its log else 0, [name, value, ...]], per expiry [the place of its key in
# KEYS, seconds]. One argument, not eight an entry: redis-py packs each argument in Python.
# Returns how many entries Redis refused (a key holding something else); the rest are written.
_APPEND = """
local write = cjson.decode(ARGV[1])
local cap, refused = write[1], 0
for i, entry in ipairs(write[2]) do
  local command = {'XADD', KEYS[i]}
  if entry[1] == 0 then command[#command + 1] = 'NOMKSTREAM' end
  command[#command + 1] = 'MAXLEN'
  command[#command + 1] = '~'
  command[#command + 1] = cap
  command[#command + 1] = '*'
  for _, part in ipairs(entry[2]) do command[#command + 1] = part end
  local written = redis.pcall(unpack(command))
  if type(written) == 'table' and written.err then refused = refused + 1 end
end
for _, expiry in ipairs(write[3]) do
  redis.pcall('EXPIRE', KEYS[expiry[1]], expiry[2])
end
return refused
"""


class RedisTokenLog(TokenLog):
    """A Redis Stream per request, ``<prefix>.tokens.<request id>``.

    ``append`` hands entries to a writer task of the calling event loop, which writes what has
    gathered in one script call (an engine step's deltas for every sequence, in one round trip).
    """

    def __init__(
        self,
        url: str,
        prefix: str,
        config: TokenLogConfig | None = None,
        *,
        max_block_s: float = 30.0,
    ) -> None:
        self.config = config or TokenLogConfig()
        self._prefix = prefix
        # Writes must never hold anyone up: short timeouts, and a failure is dropped.
        self._writer = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._append = self._writer.register_script(_APPEND)
        # Readers block on XREAD for up to ``max_block_s``: their socket waits longer.
        self._reader = aioredis.from_url(
            url, socket_connect_timeout=2, socket_timeout=max_block_s + 5
        )
        self._pending: list[tuple[str, LogEntry, bool]] = []  # (request id, entry, create)
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self._dropped = 0
        self._renewed_at: dict[str, float] = {}  # key -> when its expiry was last renewed

    def key(self, request_id: str) -> str:
        return f"{self._prefix}.tokens.{request_id}"

    def append(self, entries: Appended, *, create: bool = True) -> None:
        if not entries:
            return
        if time.monotonic() < self._down_until or len(self._pending) >= self.config.max_pending:
            self._dropped += len(entries)
            return
        self._pending.extend((request_id, entry, create) for request_id, entry in entries)
        self._idle.clear()
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write_forever())

    async def flush(self) -> None:
        if self._task is not None and not self._task.done():
            await self._idle.wait()

    async def _write_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch, self._pending = self._pending, []
                await self._write(batch)
            self._idle.set()

    async def _write(self, batch: list[tuple[str, LogEntry, bool]]) -> None:
        """Write what gathered: one script call for up to ``WRITE_CHUNK`` entries and their
        logs' expiries. A pipeline of two commands an entry cost the writer ~50 us an entry in
        redis-py's packing and parsing; the script, ~12 (``scripts/bench_tokenlog_write.py``,
        docs/frontdoor.md)."""
        try:
            for first in range(0, len(batch), WRITE_CHUNK):
                failed = await self._write_chunk(batch[first : first + WRITE_CHUNK])
                if failed:  # a key of another type: those entries only are lost
                    log.warning("token_log_entries_refused", entries=failed)
        except (RedisError, OSError) as error:
            self._down_until = time.monotonic() + self.config.retry_after_s
            self._renewed_at.clear()  # the expiries may not have been set
            log.warning(
                "token_log_write_failed",
                entries=len(batch),
                dropped_before=self._dropped,
                error=error,
            )
            self._dropped = 0
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not end the writer
            log.exception("token_log_write_failed", entries=len(batch))

    async def _write_chunk(self, chunk: list[tuple[str, LogEntry, bool]]) -> int:
        """The chunk's entries, in order, then the expiries of the logs they wrote; how many
        entries Redis refused."""
        keys: list[str] = []
        entries: list[tuple[int, list[str]]] = []
        made: dict[str, int] = {}  # key -> its place in KEYS, for those that may be new
        ended: dict[str, int] = {}
        for request_id, entry, create in chunk:
            key = self.key(request_id)
            keys.append(key)
            fields = [part for pair in entry.fields().items() for part in pair]
            entries.append((int(create), fields))
            if create:
                made[key] = len(keys)
            if ends(entry):
                ended[key] = len(keys)
        # The expiry is renewed once a tenth of the TTL per key, not with every step's delta
        # (half the commands of a step otherwise): a log lives at least 90 % of the TTL past
        # its last write. A request that ended keeps its log only a linger more.
        ttl_s = max(1, int(self.config.ttl_s))
        now = time.monotonic()
        if len(self._renewed_at) > 100_000:
            self._renewed_at.clear()
        expiries: list[tuple[int, int]] = []
        for key, place in made.items():
            if key not in ended and now - self._renewed_at.get(key, -ttl_s) >= ttl_s / 10:
                expiries.append((place, ttl_s))
                self._renewed_at[key] = now
        linger_s = max(1, math.ceil(self.config.kept_after_end_s))
        for key, place in ended.items():
            expiries.append((place, linger_s))
            self._renewed_at.pop(key, None)
        write = orjson.dumps((self.config.max_entries, entries, expiries))
        return int(await self._append(keys=keys, args=[write]))

    async def read(
        self, request_id: str, after: str = START, *, count: int = 512, block_s: float = 0.0
    ) -> Read | None:
        block_ms = int(block_s * 1000)
        try:
            found = await self._reader.xread(
                {self.key(request_id): after}, count=count, block=block_ms or None
            )
        except (RedisError, OSError) as error:
            log.warning("token_log_read_failed", request_id=request_id, error=error)
            return None
        if not found:
            return []
        # RESP2 (this client's default): [[key, [(entry id, {field: value}), ...]]]; RESP3:
        # {key: [[(entry id, {field: value}), ...]]}.
        shaped = cast(Any, found)
        entries = next(iter(shaped.values()))[0] if isinstance(shaped, dict) else shaped[0][1]
        return [(_text(entry_id), LogEntry.from_fields(fields)) for entry_id, fields in entries]

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.flush(), 2.0)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._writer.aclose()
        await self._reader.aclose()
