"""Prometheus metrics: what each process counts and times, and the exporter that serves them.

Every process counts what it does itself (the API its admissions and rejections, the batcher
the batches it forms, a worker the batches it runs, any process the state changes it commits)
and serves its own figures: the API on ``/metrics`` of its ops listener, every other role on
``BATCHSERVE_METRICS_PORT`` when set. Prometheus adds them up across processes. A Celery
worker's batches run in its pool's child processes, so a worker collects them through
``prometheus_client``'s multiprocess mode (one small file per child, merged at scrape time).
Gauges of the whole deployment (queue depth, slots) are read from the store by the API at
scrape time: see :mod:`core.ops`.

Metric objects are built on first use, so a worker can switch to multiprocess mode before.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)

from batchserve.core import scratch
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings

log = get_logger("batchserve.metrics")

LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
MODEL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
TOKEN_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
SIZE_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)
GC_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
FILL_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@dataclass(frozen=True)
class Metrics:
    """The process's metric objects (one set per process: see :func:`metrics`)."""

    admissions: Counter
    rejections: Counter
    retries: Counter
    poison_isolations: Counter
    expirations: Counter
    cancellations: Counter
    finished: Counter
    batches_dispatched: Counter
    batch_joiners: Counter
    batch_joins_refused: Counter
    batch_joins_offered: Counter
    batches_finished: Counter
    webhook_deliveries: Counter
    batch_size: Histogram
    batch_fill_ratio: Histogram
    pipeline_lead: Gauge
    clock_offset: Gauge
    queue_wait: Histogram
    batch_wait: Histogram
    model_time: Histogram
    results_store: Histogram
    latency: Histogram
    ttft: Histogram
    inter_token: Histogram
    time_per_token: Histogram
    gc_pause: Histogram


@cache
def metrics() -> Metrics:
    """The metrics of this process, registered in the default registry on first use."""
    return Metrics(
        admissions=Counter(
            "batchserve_admissions_total",
            "Requests accepted (202) and persisted, by model and lane",
            ["model", "lane"],
        ),
        rejections=Counter(
            "batchserve_rejections_total",
            "Submissions refused, by reason (the problem code: invalid_input, overloaded, ...)",
            ["reason"],
        ),
        retries=Counter(
            "batchserve_retries_total",
            "Requests put back in the queue after their batch failed, crashed or was abandoned",
            ["model"],
        ),
        poison_isolations=Counter(
            "batchserve_poison_isolations_total",
            "Requests that made the model fail when run alone, and were charged a failure",
        ),
        expirations=Counter(
            "batchserve_expirations_total", "Requests expired: their deadline could not be met"
        ),
        cancellations=Counter("batchserve_cancellations_total", "Requests cancelled"),
        finished=Counter(
            "batchserve_requests_finished_total",
            "Requests that reached a terminal state, by state",
            ["state"],
        ),
        batches_dispatched=Counter(
            "batchserve_batches_dispatched_total", "Batches handed to a worker", ["model"]
        ),
        batch_joiners=Counter(
            "batchserve_batch_joiners_total",
            "Requests claimed into a batch sent ahead, after it was sent (late joiners)",
            ["model"],
        ),
        batch_joins_refused=Counter(
            "batchserve_batch_joins_refused_total",
            "Offers of late joiners refused: the batch's model had started, or it was full",
            ["model"],
        ),
        batch_joins_offered=Counter(
            "batchserve_batch_joins_offered_total",
            "Late joiners put in a batch's join box, by who offered them (api, batcher)",
            ["model", "by"],
        ),
        batches_finished=Counter(
            "batchserve_batches_finished_total",
            "Batches a worker finished, by outcome (succeeded, crashed, stale)",
            ["model", "outcome"],
        ),
        webhook_deliveries=Counter(
            "batchserve_webhook_deliveries_total",
            "Webhook delivery attempts, by outcome (delivered, retry, failed, disable)",
            ["outcome"],
        ),
        batch_size=Histogram(
            "batchserve_batch_size",
            "Requests per dispatched batch",
            ["model"],
            buckets=SIZE_BUCKETS,
        ),
        batch_fill_ratio=Histogram(
            "batchserve_batch_fill_ratio",
            "Batch size over the model's max_batch_size",
            ["model"],
            buckets=FILL_BUCKETS,
        ),
        pipeline_lead=Gauge(
            "batchserve_pipeline_lead_seconds",
            "How long before a slot's running batch ends the batcher sends it the next (learned)",
            ["model"],
        ),
        clock_offset=Gauge(
            "batchserve_clock_offset_seconds",
            "Postgres's clock less this host's at the last sync (a host more than 50 ms off is "
            "corrected to it)",
            multiprocess_mode="mostrecent",
        ),
        queue_wait=Histogram(
            "batchserve_queue_wait_seconds",
            "From acceptance until the batcher holds the request",
            ["model", "lane"],
            buckets=LATENCY_BUCKETS_S,
        ),
        batch_wait=Histogram(
            "batchserve_batch_wait_seconds",
            "From the batcher holding a request until its batch leaves",
            ["model", "lane"],
            buckets=LATENCY_BUCKETS_S,
        ),
        model_time=Histogram(
            "batchserve_model_seconds",
            "Time of one batch on the model",
            ["model"],
            buckets=MODEL_BUCKETS_S,
        ),
        results_store=Histogram(
            "batchserve_results_store_seconds",
            "From a batch's model end until its results are committed and announced",
            ["model"],
            buckets=TOKEN_BUCKETS_S,
        ),
        latency=Histogram(
            "batchserve_request_latency_seconds",
            "End to end (the completion time): from acceptance until the model finished the "
            "request",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
        ),
        ttft=Histogram(
            "batchserve_time_to_first_token_seconds",
            "From acceptance until the model made the request's first token (a batch model: "
            "its whole answer)",
            ["model"],
            buckets=LATENCY_BUCKETS_S,
        ),
        inter_token=Histogram(
            "batchserve_inter_token_latency_seconds",
            "Between two successive pieces of one request's output (engine models)",
            ["model"],
            buckets=TOKEN_BUCKETS_S,
        ),
        time_per_token=Histogram(
            "batchserve_time_per_output_token_seconds",
            "Per request, from its first token to its last, over its tokens after the first "
            "(engine models)",
            ["model"],
            buckets=TOKEN_BUCKETS_S,
        ),
        gc_pause=Histogram(
            "batchserve_gc_pause_seconds",
            "Collections of the process's garbage collector (the process stands still), by "
            "generation (2: a full pass)",
            ["generation"],
            buckets=GC_BUCKETS_S,
        ),
    )


@cache
def watch_gc() -> None:
    """Time each of this process's garbage collections into ``batchserve_gc_pause_seconds``
    (once per process). The callback only observes into children resolved beforehand."""
    children = [metrics().gc_pause.labels(str(generation)) for generation in range(3)]
    started: list[float] = []

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            children[info["generation"]].observe(time.perf_counter() - started.pop())

    gc.callbacks.append(timed)


# -- serving ---------------------------------------------------------------------------------


def enable_multiprocess(directory: Path) -> None:
    """Make the metrics of this process and its future children land in ``directory``.

    Call before the first metric is used and before the pool forks. ``prometheus_client``
    chooses its value class from ``PROMETHEUS_MULTIPROC_DIR`` when imported, so this sets both.
    """
    from prometheus_client import values

    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values.ValueClass = values.MultiProcessValue()


def multiprocess_dir(role: str) -> Path:
    """A fresh directory for one role's processes (a worker's pool, several API processes),
    owned by them (:mod:`batchserve.core.scratch`: swept once all are gone, if killed before
    :func:`remove_multiprocess_dir`)."""
    return scratch.make(f"batchserve-metrics-{role}-")


def remove_multiprocess_dir(directory: Path) -> None:
    scratch.remove(directory)


def mark_process_dead(pid: int) -> None:
    """A pool child exits: its live gauges go (its counters stay counted)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def processes_registry(directory: Path | str) -> CollectorRegistry:
    """The metrics of every process that counts into ``directory`` (multiprocess mode), added
    up at each scrape."""
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return registry


def serve_role_metrics(settings: Settings, role: str) -> None:
    """Start a role's exporter when ``BATCHSERVE_METRICS_PORT`` is set (batcher, maintenance,
    webhooks; the worker serves its pool's, the API its ops listener)."""
    if settings.metrics_port is not None:
        stall_s = settings.health_stall_s
        serve_exporter(settings.metrics_port, settings.metrics_host, role, stall_after_s=stall_s)


def serve_exporter(
    port: int,
    host: str,
    role: str,
    *,
    directory: Path | None = None,
    stall_after_s: float = 30.0,
) -> None:
    """Serve this process's metrics (or, with ``directory``, its pool's) on ``host:port``,
    with the role's ``/healthz`` and ``/readyz`` (:mod:`core.health`)."""
    from batchserve.core.health import ops_app, role_health, serve_ops

    metrics()  # declare every metric now, so a scrape shows them before they first move
    registry = REGISTRY if directory is None else processes_registry(directory)
    health = role_health()
    health.stall_after_s = stall_after_s
    serve_ops(ops_app(make_wsgi_app(registry), health), host, port)
    log.info("metrics_exporter", url=f"http://{host}:{port}/metrics", role=role)
