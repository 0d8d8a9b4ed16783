"""The Celery app: one durable queue ``batches.<model>`` per model, and ``webhooks``.

These are classic durable queues with persistent, confirmed messages, not quorum queues: a
task message is only a hand-over (Postgres holds the batch and its lease, and the reaper
recovers one that is lost), and quorum queues would make Celery set up its ETA machinery
(28 extra queues per broker) for tasks that never have an ETA.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.worker.consumer import Consumer
from kombu import Queue

from batchserve.core.broker import heartbeat_of
from batchserve.core.settings import Settings

RUN_BATCH_TASK = "batchserve.run_batch"
DELIVER_WEBHOOK_TASK = "batchserve.deliver_webhook"


# Between a worker's attempts to get its broker connection back. Celery's consumer leaves these
# to kombu's defaults, 2 s growing by 2 s to 30 s: a worker host whose link was cut for a few
# seconds then stays away for as long again, or up to 30 s, while batches wait for capacity.
RECONNECT_INTERVALS = {"interval_start": 0.5, "interval_step": 0.5, "interval_max": 2.0}


class QuickReconnectConsumer(Consumer):
    """Celery's consumer (``worker_consumer``), retrying a lost broker connection every
    0.5 s, then every 1, 1.5 and 2 s, for as many tries as ``broker_connection_max_retries``."""

    def ensure_connected(self, conn: Any) -> Any:
        conn.ensure_connection = functools.partial(conn.ensure_connection, **RECONNECT_INTERVALS)
        return super().ensure_connected(conn)


def batches_queue_name(settings: Settings, model: str) -> str:
    return settings.name("batches", model)


def batches_queue(settings: Settings, model: str) -> Queue:
    name = batches_queue_name(settings, model)
    return Queue(name, routing_key=name, durable=True)


def webhooks_queue_name(settings: Settings) -> str:
    return settings.name("webhooks")


def webhooks_queue(settings: Settings) -> Queue:
    name = webhooks_queue_name(settings)
    return Queue(name, routing_key=name, durable=True)


def create_celery(settings: Settings, models: Iterable[str], *, webhooks: bool = False) -> Celery:
    """A Celery app for ``models`` (and the webhooks queue): late acks, prefetch 1, confirmed
    publishes, no results."""
    if not settings.broker_url:
        raise ValueError("Celery needs BATCHSERVE_BROKER_URL")
    app = Celery("batchserve", broker=settings.broker_url, set_as_current=False)
    queues = [batches_queue(settings, m) for m in models]
    if webhooks:
        queues.append(webhooks_queue(settings))
    app.conf.update(
        task_queues=queues,
        task_acks_late=True,
        # A child killed mid-batch: the lease reaper requeues its requests (in halves), so the
        # message itself is not redelivered as a whole.
        task_reject_on_worker_lost=False,
        task_acks_on_failure_or_timeout=True,
        # Each slot holds one batch beyond the one it runs: the batcher sends the next batch
        # just before the running one ends, and the pool starts it without a round trip.
        worker_prefetch_multiplier=2,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
        broker_heartbeat=heartbeat_of(settings.broker_url, settings.broker_heartbeat_s),
        task_publish_retry_policy={
            "max_retries": 2,
            "interval_start": 0.1,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_detect_quorum_queues=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_consumer=f"{__name__}:{QuickReconnectConsumer.__name__}",
    )
    return app
