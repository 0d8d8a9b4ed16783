"""A Celery worker that lost its broker tries again within seconds, not Celery's default 2 s
growing to 30 s: a worker host back from a network cut serves again at once
(tests/chaos/test_cross_host.py asserts it across real hosts)."""

from __future__ import annotations

import time
import types

import pytest
from celery import Celery
from kombu import Connection
from kombu.exceptions import OperationalError

from batchserve.core.settings import Settings
from batchserve.workers.celery_app import QuickReconnectConsumer, create_celery

CLOSED = "amqp://guest:guest@127.0.0.1:1//"  # nothing listens: every try is refused at once
SETTINGS = Settings(
    database_url="postgresql+psycopg://postgres@127.0.0.1:1/none",
    broker_url=CLOSED,
    redis_url="redis://127.0.0.1:1/0",
)


def consumer(app: Celery) -> QuickReconnectConsumer:
    return QuickReconnectConsumer(
        lambda *_: None,
        app=app,
        hostname="test",
        pool=None,
        timer=None,
        controller=types.SimpleNamespace(use_eventloop=False),
    )


def test_every_batchserve_worker_uses_it() -> None:
    app = create_celery(SETTINGS, ["echo-100ms"])
    assert app.conf.worker_consumer.endswith(":QuickReconnectConsumer")


def test_four_refused_tries_take_seconds_not_twenty() -> None:
    """Tries at 0, 0.5, 1.5 and 3 s (with kombu's defaults: 0, 2, 6 and 12 s)."""
    app = create_celery(SETTINGS, ["echo-100ms"])
    app.conf.broker_connection_max_retries = 3
    app.conf.broker_connection_retry_on_startup = True
    started = time.monotonic()
    with pytest.raises(OperationalError), Connection(CLOSED, connect_timeout=1) as conn:
        consumer(app).ensure_connected(conn)
    assert 2.5 < time.monotonic() - started < 6.0
