"""Each tenant's webhook signing secret: created on first use, rotated with a grace period.

After a rotation the previous secret keeps signing next to the new one (two signatures in
``webhook-signature``) for ``BATCHSERVE_WEBHOOK_SECRET_GRACE_S``, so receivers can switch to
the new secret without dropping a webhook. Rotating again within the grace drops the oldest.
Secrets are stored encrypted (``core.secretbox``) and shown in clear once, when made.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from batchserve.core.errors import AlreadyExists
from batchserve.core.secretbox import SecretBox
from batchserve.core.signing import generate_secret
from batchserve.core.store import JobStore, SecretRow


@dataclass(frozen=True, slots=True)
class SecretInfo:
    """What may be shown about a secret besides the secret itself."""

    created_at: datetime
    previous_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class NewSecret:
    """A secret just made: the only time it is shown in clear."""

    secret: str
    info: SecretInfo


class WebhookSecrets:
    """Creates, rotates and reads back (decrypted, for signing) the tenants' secrets."""

    def __init__(self, store: JobStore, box: SecretBox, *, grace_s: float) -> None:
        self._store = store
        self._box = box
        self.grace_s = grace_s

    async def info(self, tenant: str) -> SecretInfo | None:
        row = await self._store.get_secret(tenant)
        return _info(row) if row else None

    async def create(self, tenant: str, now: float) -> NewSecret:
        """The tenant's first secret; ``AlreadyExists`` if it has one (rotate it instead)."""
        secret = generate_secret()
        if not await self._store.insert_secret(tenant, self._box.encrypt(secret), now=now):
            raise AlreadyExists(
                "a webhook secret exists already; POST /v1/webhooks/secret/rotate replaces it"
            )
        row = await self._store.get_secret(tenant)
        assert row is not None
        return NewSecret(secret, _info(row))

    async def rotate(self, tenant: str, now: float) -> NewSecret:
        """A new current secret; the old one signs too until the grace period ends."""
        secret = generate_secret()
        row = await self._store.rotate_secret(
            tenant, self._box.encrypt(secret), now=now, previous_expires_at=now + self.grace_s
        )
        return NewSecret(secret, _info(row))

    async def signing_secrets(self, tenant: str, now: float) -> list[str]:
        """The secrets that sign a webhook sent now: the current one first, created if none."""
        row = await self._store.get_secret(tenant)
        if row is None:
            await self._store.insert_secret(tenant, self._box.encrypt(generate_secret()), now=now)
            row = await self._store.get_secret(tenant)
            assert row is not None
        secrets = [self._box.decrypt(row.secret_enc)]
        expires = row.previous_expires_at
        if row.previous_enc is not None and expires is not None and expires.timestamp() > now:
            secrets.append(self._box.decrypt(row.previous_enc))
        return secrets


def _info(row: SecretRow) -> SecretInfo:
    return SecretInfo(created_at=row.created_at, previous_expires_at=row.previous_expires_at)
