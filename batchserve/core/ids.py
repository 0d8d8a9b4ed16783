"""Time-ordered identifiers (UUIDv7, RFC 9562), so ids sort by creation and paginate as cursors."""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48-bit Unix milliseconds, then a 12-bit counter, then random bits.

    The counter keeps ids minted in the same millisecond by this process in order.
    Python 3.14 ships ``uuid.uuid7``; this is the same layout for 3.11.
    """
    global _last_ms, _counter
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            now_ms = _last_ms
        else:
            _last_ms = now_ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x1FF  # leave room to count up
        counter = _counter
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (now_ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand
    return uuid.UUID(int=value)


def uuid7_floor(epoch_s: float) -> uuid.UUID:
    """The smallest UUIDv7 of that instant: ``id >= uuid7_floor(t)`` selects what was created
    since ``t`` through the primary key's index, with no index on a time column."""
    value = ((int(epoch_s * 1000) & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (0b10 << 62)
    return uuid.UUID(int=value)


LINE_BITS = 20  # lines of one bulk job: up to 1,048,576 (BATCHSERVE_BATCH_MAX_REQUESTS is lower)


@functools.lru_cache(maxsize=64)
def _job_digest(job_id: uuid.UUID) -> int:
    return int.from_bytes(hashlib.blake2b(job_id.bytes, digest_size=8).digest(), "big")


def job_request_id(job_id: uuid.UUID, line: int) -> uuid.UUID:
    """The id of line ``line`` of a bulk job: the same every time it is computed.

    Ingest that dies halfway is resumed with the same ids, so a line is one request however
    often it is read. The layout is still a UUIDv7: the job's millisecond, then the line
    number, then bits of a hash of the job id, so a job's requests sort by line and after
    older requests.
    """
    if not 0 <= line < (1 << LINE_BITS):
        raise ValueError(f"line {line} out of range")
    job_ms = job_id.int >> 80
    digest = _job_digest(job_id)
    rest = (line << (74 - LINE_BITS)) | (digest & ((1 << (74 - LINE_BITS)) - 1))
    value = (job_ms << 80) | (0x7 << 76) | ((rest >> 62) << 64) | (0b10 << 62)
    value |= rest & ((1 << 62) - 1)
    return uuid.UUID(int=value)
