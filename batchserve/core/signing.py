"""Standard Webhooks signatures: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``.

The format Svix and the Standard Webhooks spec define, so receivers verify batchserve's webhooks
with an off-the-shelf library (``standardwebhooks``, ``svix``) instead of code of their own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
USER_AGENT = "batchserve-webhooks/0.1"


def generate_secret() -> str:
    """A new signing secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a secret: the raw bytes after ``whsec_``."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    # Tolerate a secret pasted without its base64 padding, as the reference libraries do.
    return base64.b64decode(encoded + "=" * (-len(encoded) % 4))


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,...`` signature of ``body`` as sent under ``msg_id`` at ``timestamp``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def webhook_headers(
    secrets_in_use: Sequence[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The headers of one attempt; during a rotation, one signature per live secret."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(s, msg_id, timestamp, body) for s in secrets_in_use),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
