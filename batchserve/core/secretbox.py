"""Encryption at rest for secrets batchserve must read back in clear (webhook signing secrets).

Fernet (AES-128-CBC with HMAC-SHA256) under a server key from ``BATCHSERVE_SECRET_KEY``: a
database dump alone does not reveal a tenant's signing secret. Several comma-separated keys
rotate the server key: the first encrypts, every one decrypts. In development, when the setting
is unset, a key is generated once into ``<home>/secret.key`` (mode 0600); production refuses to
start without the setting (see ``Settings``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from batchserve.core.errors import BatchserveError
from batchserve.core.settings import Settings

KEY_FILE = "secret.key"


class SecretUnreadable(BatchserveError):
    """A stored secret does not decrypt: the server key changed without keeping the old one."""

    code = "secret_unreadable"


class SecretBox:
    """Encrypts and decrypts short secrets with the server key(s)."""

    def __init__(self, keys: Sequence[str]) -> None:
        if not keys:
            raise ValueError("SecretBox needs at least one key")
        self._fernet = MultiFernet([Fernet(k.encode()) for k in keys])

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        keys = settings.secret_key_list
        if not keys:
            # Settings refuse production without a key, so this is development.
            keys = [development_key(settings.home)]
        return cls(keys)

    def encrypt(self, plaintext: str) -> str:
        return self._fernet.encrypt(plaintext.encode()).decode()

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken as error:
            raise SecretUnreadable(
                "a stored secret does not decrypt with BATCHSERVE_SECRET_KEY; "
                "keep the old key after the new one until secrets are rotated"
            ) from error


def development_key(home: Path) -> str:
    """The development server key under ``home``, created (0600) by whichever process is first."""
    path = home / KEY_FILE
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        # O_EXCL: several roles starting at once must agree on one key, not each write their own.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(Fernet.generate_key().decode())
    for _ in range(100):
        key = path.read_text().strip()
        if key:  # the creator may not have written it yet
            return key
        time.sleep(0.01)
    raise RuntimeError(f"{path} is empty; delete it to have a new key generated")
