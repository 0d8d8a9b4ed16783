"""API keys: how they look, how they are hashed, how a presented one is checked.

A key is ``bsk_<id>_<secret>``: the id (public, shown by ``batchserve keys list``) finds the
row, and the SHA-256 of the whole key is compared in constant time. Keys carry 256 bits of
randomness, so a fast hash is the right one (a password hash buys nothing against a brute force
that 2**256 already defeats, and would cost every request milliseconds). The key itself is
printed once, when made, and is never stored or logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

PREFIX = "bsk_"
_SHAPE = re.compile(r"^bsk_([a-z0-9]{12})_([A-Za-z0-9_-]{43})$")
TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True, slots=True)
class NewKey:
    id: str
    key: str  # shown once
    sha256: str


def new_key() -> NewKey:
    key_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return NewKey(id=key_id, key=key, sha256=digest(key))


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_id_of(presented: str) -> str | None:
    """The id part of a well-formed key, or None for anything else."""
    match = _SHAPE.match(presented)
    return match.group(1) if match else None


def matches(presented: str, stored_sha256: str) -> bool:
    return hmac.compare_digest(digest(presented), stored_sha256)


def valid_tenant_name(name: str) -> bool:
    return bool(TENANT_NAME.match(name))
