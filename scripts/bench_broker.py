"""What RabbitMQ's own CPU costs a request message, by the kind of queue that carries it.

    python scripts/bench_broker.py --json > docs/frontdoor-broker.json

At low load the API publishes one message a request (a group commit of one), and RabbitMQ
then spends about as much CPU as the API's whole submit (`bench --scenario frontdoor`, its
pg/mq/redis column). This isolates the broker's part: an interactive request's message (the
body the API sends, persistent, on a confirmed channel) published open loop at a fixed rate
and consumed with an ack each (prefetch 64), as the batcher does, through three kinds of
queue:

- **quorum**: what batchserve declares (`QUEUE_ARGUMENTS`: quorum, single active consumer);
- **classic**: a durable classic queue, persistent messages, single active consumer;
- **transient**: a non-durable classic queue, non-persistent messages.

For each: RabbitMQ's CPU (its processes' from ``/proc``, between the first publish and the
last ack) a message, and the wall milliseconds from publish to delivery and to confirm.
Each kind runs ``--seconds`` at each rate, in turn, ``--rounds`` times (quorum, classic,
transient, quorum, ...). Needs ``BATCHSERVE_BROKER_URL`` (a local RabbitMQ: its CPU is read
from this host's ``/proc``); its queues are named ``bench-broker-<random>`` and deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import aio_pika
from benchmarks_docs import machine as benchmarks_machine

from batchserve.bench.stack import percentile, server_cpu_per, server_cpu_s
from batchserve.core.broker import QUEUE_ARGUMENTS
from batchserve.core.domain import Lane, QueueMessage
from batchserve.core.settings import load_settings

KINDS: dict[str, tuple[bool, dict[str, Any]]] = {  # durable queue and messages; arguments
    "quorum": (True, QUEUE_ARGUMENTS),
    "classic": (True, {"x-queue-type": "classic", "x-single-active-consumer": True}),
    "transient": (False, {"x-queue-type": "classic"}),
}


def _body(n: int) -> bytes:
    now = time.time()
    return QueueMessage(
        id=f"0190f000-0000-7000-8000-{n:012d}",
        model="echo-100ms",
        lane=Lane.INTERACTIVE,
        tenant="bench",
        created_at=now,
        deadline=now + 30.0,
        prompt_tokens=3,
        max_tokens=16,
    ).encode()


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1000.0, 2)


async def one_round(url: str, kind: str, rate: float, seconds: float) -> dict[str, Any]:
    durable, arguments = KINDS[kind]
    mode = aio_pika.DeliveryMode.PERSISTENT if durable else aio_pika.DeliveryMode.NOT_PERSISTENT
    connection = await aio_pika.connect(url)
    try:
        publisher = await connection.channel(publisher_confirms=True)
        consumer = await connection.channel()
        await consumer.set_qos(prefetch_count=64)
        name = f"bench-broker-{secrets.token_hex(4)}"
        queue = await consumer.declare_queue(name, durable=durable, arguments=arguments)
        count = int(rate * seconds)
        sent: dict[str, float] = {}
        delivered: list[float] = []
        confirmed: list[float] = []
        done = asyncio.Event()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            delivered.append(time.perf_counter() - sent[message.message_id or ""])
            await message.ack()
            if len(delivered) == count:
                done.set()

        tag = await queue.consume(on_message)

        async def publish(n: int) -> None:
            key = str(n)
            sent[key] = time.perf_counter()
            message = aio_pika.Message(
                _body(n), delivery_mode=mode, content_type="application/json", message_id=key
            )
            await publisher.default_exchange.publish(message, routing_key=name)
            confirmed.append(time.perf_counter() - sent[key])

        before = server_cpu_s()
        started = time.perf_counter()
        tasks = []
        for n in range(count):
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(publish(n)))
        await asyncio.gather(*tasks)
        await asyncio.wait_for(done.wait(), 60.0)
        wall_s = time.perf_counter() - started
        after = server_cpu_s()
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
    finally:
        await connection.close()
    return {
        "kind": kind,
        "rate": rate,
        "messages": count,
        "achieved_rps": round(count / wall_s, 1),
        "rabbitmq_cpu_ms_per_message": server_cpu_per(before, after, count)["rabbitmq"],
        "deliver_ms": {"p50": _ms(delivered, 0.5), "p90": _ms(delivered, 0.9)},
        "confirm_ms": {"p50": _ms(confirmed, 0.5), "p90": _ms(confirmed, 0.9)},
    }


def summarize(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kind at each rate: its rounds' CPU a message (every round, and the median)."""
    rows = []
    for rate in sorted({r["rate"] for r in rounds}):
        for kind in KINDS:
            mine = [r for r in rounds if r["kind"] == kind and r["rate"] == rate]
            if not mine:
                continue
            cpu = [r["rabbitmq_cpu_ms_per_message"] for r in mine]
            rows.append(
                {
                    "kind": kind,
                    "rate": rate,
                    "cpu_ms_per_message": cpu,
                    "cpu_ms_median": round(statistics.median(cpu), 3),
                    "deliver_p50_ms": [r["deliver_ms"]["p50"] for r in mine],
                }
            )
    return rows


def machine() -> dict[str, Any]:
    """The CPU these figures belong to (they move between machines) and when they were taken."""
    host = benchmarks_machine()
    return {"cpu": host["cpu"], "cores": host["cores"], "date": host["when"][:10]}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,1000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    url = load_settings().broker_url
    if not url:
        raise SystemExit("set BATCHSERVE_BROKER_URL (a local RabbitMQ)")
    rounds = []
    for rate in (float(r) for r in args.rates.split(",")):
        for _ in range(args.rounds):
            for kind in KINDS:
                rounds.append(await one_round(url, kind, rate, args.seconds))
    report(
        {"machine": machine(), "rounds": rounds, "summary": summarize(rounds)},
        as_json=args.json,
        line=lambda row: (
            f"{row['kind']:>9} at {row['rate']:>6.0f}/s: RabbitMQ CPU ms a message "
            f"{row['cpu_ms_per_message']} (median {row['cpu_ms_median']}); "
            f"publish to delivery p50 {row['deliver_p50_ms']} ms"
        ),
    )


def report(
    document: dict[str, Any], *, as_json: bool, line: Callable[[dict[str, Any]], str]
) -> None:
    """The whole document as JSON, or a line for each row of its summary."""
    if as_json:
        print(json.dumps(document, indent=1))
        return
    for row in document["summary"]:
        print(line(row))


if __name__ == "__main__":
    asyncio.run(main())
