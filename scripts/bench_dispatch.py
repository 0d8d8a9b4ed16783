"""What handing one batch to the workers costs the batcher, by the way it is sent.

    python scripts/bench_dispatch.py --json > docs/frontdoor-dispatch.json

The batcher sends each batch as a Celery task message to ``batches.<model>``, awaiting
RabbitMQ's confirm before it goes on. Two ways, each sending the same batches (``--items``
members of a 16-character input each, as the fixed model's batches at 100/s) one after the
other, as the batcher does:

- **send_task**: Celery's ``send_task`` in a one-thread executor, awaited from the loop (what
  the batcher did until the change in docs/frontdoor.md, "The batch task leaves on the
  batcher's own loop");
- **aio-pika**: :class:`batchserve.workers.dispatch.CeleryDispatcher`, which publishes the
  message Celery builds on the loop through the batcher's confirmed aio-pika channel.

For each: this process's CPU a batch (every thread's, ``time.process_time``), RabbitMQ's (its
processes' from ``/proc``), and the wall milliseconds a send takes (p50, p90). The ways
alternate, ``--rounds`` rounds of ``--batches`` each, after one unmeasured warm-up round of
each. Needs ``BATCHSERVE_BROKER_URL`` (a local RabbitMQ: its CPU is read from this host's
``/proc``); the queues are named ``bench-dispatch-<random>`` and deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aio_pika
from bench_broker import machine, report
from kombu import Queue

from batchserve.bench.stack import percentile, server_cpu_per, server_cpu_s
from batchserve.core.broker import RabbitRequestQueue
from batchserve.core.domain import BatchItem, BatchMessage
from batchserve.core.settings import Settings, load_settings
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue_name, create_celery
from batchserve.workers.dispatch import CeleryDispatcher

WAYS = ("send_task", "aio-pika")
MODEL = "echo-100ms"


def batch(n: int, items: int) -> BatchMessage:
    now = time.time()
    members = tuple(
        BatchItem(
            request_id=f"0190f000-0000-7000-8000-{n * 1000 + i:012d}",
            input=f"load {n * 1000 + i:011d}",
            messages=None,
            params={"max_tokens": 16},
            created_at=now,
            received_at=now,
        )
        for i in range(items)
    )
    return BatchMessage(
        batch_id=f"0190f000-0000-7000-9000-{n:012d}",
        model=MODEL,
        dispatched_at=now,
        estimated_s=0.1,
        items=members,
    )


class SendTask:
    """The way it was: ``send_task`` (kombu, blocking on the confirm) in one thread."""

    def __init__(self, settings: Settings) -> None:
        self._app = create_celery(settings, [MODEL])
        self._queue = Queue(
            batches_queue_name(settings, MODEL),
            routing_key=batches_queue_name(settings, MODEL),
            durable=True,
        )
        self._executor = ThreadPoolExecutor(max_workers=1)

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        await asyncio.get_running_loop().run_in_executor(
            self._executor,
            lambda: self._app.send_task(
                RUN_BATCH_TASK,
                args=[message.as_dict()],
                queue=self._queue,
                time_limit=time_limit_s,
                task_id=message.batch_id,
            ),
        )

    async def close(self) -> None:
        self._executor.shutdown(wait=True)


class OnTheLoop:
    def __init__(self, settings: Settings) -> None:
        self._broker = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
        self._dispatcher = CeleryDispatcher(
            create_celery(settings, [MODEL]), settings, self._broker
        )

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        await self._dispatcher.dispatch(message, time_limit_s)

    async def close(self) -> None:
        await self._broker.close()


async def one_round(
    way: str, settings: Settings, batches: int, items: int, first: int
) -> dict[str, Any]:
    sender = SendTask(settings) if way == "send_task" else OnTheLoop(settings)
    messages = [batch(first + n, items) for n in range(batches)]
    try:
        await sender.dispatch(messages[0], 1.0)  # connections opened, queue declared
        waits: list[float] = []
        before_cpu, before_servers = time.process_time(), server_cpu_s()
        for message in messages[1:]:
            started = time.perf_counter()
            await sender.dispatch(message, 1.0)
            waits.append(time.perf_counter() - started)
        cpu_s, after_servers = time.process_time() - before_cpu, server_cpu_s()
    finally:
        await sender.close()
    sent = len(messages) - 1
    return {
        "way": way,
        "batches": sent,
        "items": items,
        "cpu_ms_per_batch": round(cpu_s * 1000.0 / sent, 3),
        "rabbitmq_cpu_ms_per_batch": server_cpu_per(before_servers, after_servers, sent)[
            "rabbitmq"
        ],
        "send_ms": {
            "p50": round(percentile(waits, 0.5) * 1000.0, 3),
            "p90": round(percentile(waits, 0.9) * 1000.0, 3),
        },
    }


def summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each way: its rounds' figures (every round, and the median of the CPU a batch)."""
    rows = []
    for way in WAYS:
        mine = [r for r in rounds if r["way"] == way]
        cpu = [r["cpu_ms_per_batch"] for r in mine]
        rows.append(
            {
                "way": way,
                "cpu_ms_per_batch": cpu,
                "cpu_ms_median": round(statistics.median(cpu), 3),
                "rabbitmq_cpu_ms_per_batch": [r["rabbitmq_cpu_ms_per_batch"] for r in mine],
                "send_p50_ms": [r["send_ms"]["p50"] for r in mine],
            }
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = load_settings()
    if not base.broker_url:
        raise SystemExit("set BATCHSERVE_BROKER_URL (a local RabbitMQ)")
    settings = base.model_copy(update={"namespace": f"bench-dispatch-{secrets.token_hex(4)}"})
    rounds = []
    try:
        for way in WAYS:  # warm-up, not recorded
            await one_round(way, settings, 50, args.items, 0)
        for number in range(args.rounds):
            for way in WAYS:
                first = (number * len(WAYS) + WAYS.index(way) + 1) * (args.batches + 1)
                rounds.append(await one_round(way, settings, args.batches + 1, args.items, first))
    finally:
        connection = await aio_pika.connect(settings.broker_url or "")
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(batches_queue_name(settings, MODEL))
    report(
        {
            "command": "python scripts/bench_dispatch.py --json",
            "machine": machine(),
            "rounds": rounds,
            "summary": summarize(rounds),
        },
        as_json=args.json,
        line=lambda row: (
            f"{row['way']:>9}: the sender's CPU ms a batch {row['cpu_ms_per_batch']} "
            f"(median {row['cpu_ms_median']}); RabbitMQ's {row['rabbitmq_cpu_ms_per_batch']}; "
            f"send p50 {row['send_p50_ms']} ms"
        ),
    )


if __name__ == "__main__":
    asyncio.run(main())
