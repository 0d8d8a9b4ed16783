"""Every AMQP connection batchserve opens carries a short heartbeat, so RabbitMQ drops a
cut-off batcher's connection, and hands its queues to the standby, within seconds rather than
the libraries' default of minutes (tests/chaos/test_cross_host.py, run d, shows the takeover)."""

from __future__ import annotations

import json
import subprocess

from batchserve.core.broker import RabbitRequestQueue, heartbeat_of, with_heartbeat
from batchserve.core.domain import Lane
from batchserve.core.settings import Settings
from batchserve.core.wiring import connect
from batchserve.workers.celery_app import create_celery


def negotiated_timeouts(connection_name: str) -> list[int]:
    """The heartbeat RabbitMQ itself agreed with each connection of that name."""
    listed = subprocess.run(
        [
            "rabbitmqctl",
            "-q",
            "--formatter",
            "json",
            "list_connections",
            "client_properties",
            "timeout",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    timeouts = []
    for connection in json.loads(listed):
        properties = {p[0]: p[2] for p in connection["client_properties"]}
        if properties.get("connection_name") == connection_name:
            timeouts.append(int(connection["timeout"]))
    return timeouts


def test_a_url_without_a_heartbeat_gets_the_setting_and_one_with_keeps_its_own() -> None:
    assert with_heartbeat("amqp://u:p%40ss@h:5672//", 5) == "amqp://u:p%40ss@h:5672//?heartbeat=5"
    assert with_heartbeat("amqp://h/v?heartbeat=30", 5) == "amqp://h/v?heartbeat=30"
    assert heartbeat_of("amqp://h/v?heartbeat=30", 5) == 30
    assert heartbeat_of("amqp://h/v", 5) == 5
    assert Settings.model_fields["broker_heartbeat_s"].default == 5


def test_celery_connections_use_the_same_heartbeat(settings: Settings) -> None:
    tuned = settings.model_copy(update={"broker_heartbeat_s": 7})
    assert create_celery(tuned, ["m"]).conf.broker_heartbeat == 7
    given = tuned.model_copy(update={"broker_url": f"{settings.broker_url}?heartbeat=11"})
    assert create_celery(given, ["m"]).conf.broker_heartbeat == 11


async def test_rabbitmq_agrees_the_heartbeat_of_the_setting(settings: Settings) -> None:
    """Through the wiring every role uses (the API's publisher, the batcher's consumers)."""
    adapters = connect(settings.model_copy(update={"broker_heartbeat_s": 4}))
    try:
        queue = adapters.queue
        assert isinstance(queue, RabbitRequestQueue)
        await queue.depth("m", Lane.INTERACTIVE)  # connects
        assert negotiated_timeouts(queue.connection_name) == [4]
    finally:
        await adapters.close()
