"""Standard Webhooks signatures: the spec's published vector, and the reference library as the
oracle for what batchserve sends (rotation included)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from batchserve.core.secretbox import SecretBox, SecretUnreadable, development_key
from batchserve.core.settings import Settings
from batchserve.core.signing import USER_AGENT, generate_secret, sign, webhook_headers

# The vector the Standard Webhooks reference libraries test against.
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_matches_the_published_vector() -> None:
    assert sign(VECTOR_SECRET, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY) == VECTOR_SIGNATURE


def test_generated_secrets_are_whsec_base64_of_32_random_bytes() -> None:
    first, second = generate_secret(), generate_secret()
    assert first.startswith("whsec_") and first != second
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32


def test_reference_library_verifies_our_headers_and_refuses_a_tampered_body() -> None:
    secret = generate_secret()
    body = b'{"type":"request.succeeded","data":{"id":"r1"}}'
    headers = webhook_headers([secret], "msg_1", int(time.time()), body)
    assert headers["user-agent"] == USER_AGENT
    assert headers["content-type"] == "application/json"
    assert Webhook(secret).verify(body, headers) == {
        "type": "request.succeeded",
        "data": {"id": "r1"},
    }
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"r1", b"r2"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(body, headers)


def test_during_a_rotation_both_secrets_verify() -> None:
    old, new = generate_secret(), generate_secret()
    body = b"{}"
    headers = webhook_headers([new, old], "msg_2", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)


def test_secrets_at_rest_are_encrypted_and_the_server_key_can_rotate() -> None:
    old_key, new_key = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    secret = generate_secret()
    stored = SecretBox([old_key]).encrypt(secret)
    assert secret not in stored and secret.removeprefix("whsec_") not in stored
    assert SecretBox([new_key, old_key]).decrypt(stored) == secret
    with pytest.raises(SecretUnreadable):
        SecretBox([new_key]).decrypt(stored)


def test_development_key_is_made_once_with_owner_only_permissions(tmp_path: Path) -> None:
    home = tmp_path / "home"
    key = development_key(home)
    assert development_key(home) == key
    assert (home / "secret.key").stat().st_mode & 0o777 == 0o600
    SecretBox([key])  # a valid Fernet key


def test_production_refuses_to_start_without_a_secret_key() -> None:
    servers: dict[str, Any] = {
        "env": "production",
        "database_url": "postgresql+psycopg://u@h/db",
        "broker_url": "amqp://h//",
        "redis_url": "redis://h/0",
    }
    with pytest.raises(ValueError, match="BATCHSERVE_SECRET_KEY"):
        Settings(**servers)
    with pytest.raises(ValueError, match="not a Fernet key"):
        Settings(**servers, secret_key=SecretStr("hunter2"))
    Settings(**servers, secret_key=SecretStr(Fernet.generate_key().decode()))
