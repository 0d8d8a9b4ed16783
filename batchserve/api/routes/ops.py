"""Operator endpoints: ``/metrics`` (Prometheus), ``/dashboard`` and the data it polls.

They show every tenant's traffic and recent failures (ids and error codes), so they are served by
the API's ops listener only (``batchserve.api.server.serve_api``, on the metrics port), never on
its public port.
"""

from __future__ import annotations

import os
from functools import cache
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from batchserve.api.deps import Services
from batchserve.api.problems import problem
from batchserve.api.responses import JSON
from batchserve.api.services import ApiServices
from batchserve.core.errors import Unavailable
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics, processes_registry
from batchserve.core.ops import ClusterCollector, OpsView
from batchserve.core.store.stats import StatsReader

log = get_logger("batchserve.api")

router = APIRouter(tags=["operations"])


def ops_view(request: Request, services: ApiServices) -> tuple[OpsView, CollectorRegistry]:
    """The app's view of the deployment, built on first use (it lives as long as the app)."""
    state = request.app.state
    if getattr(state, "ops_view", None) is None:
        adapters = services.adapters
        view = OpsView(
            StatsReader(adapters.engine),
            adapters.slots,
            adapters.registry,
            loadboard=adapters.loadboard,
        )
        cluster = CollectorRegistry(auto_describe=False)
        cluster.register(ClusterCollector(view))
        state.ops_view, state.ops_registry = view, cluster
    return state.ops_view, state.ops_registry


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request, services: Services) -> Response:
    """This process's metrics, and the deployment's queue and slot gauges."""
    view, cluster = ops_view(request, services)
    metrics()  # declared from the first scrape on, before they first move
    body = generate_latest(_processes_registry())
    try:
        await view.gauges()
        body += generate_latest(cluster)
    except Unavailable as error:  # the process's own figures are still worth a scrape
        log.warning("metrics_gauges_unavailable", error=error)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


@cache
def _processes_registry() -> CollectorRegistry:
    """This process's metrics; with ``api --processes N``, every API process's."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return processes_registry(directory) if directory else REGISTRY


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> HTMLResponse:
    """A live page of queue depth, batch sizes, latency, slots and failures."""
    return HTMLResponse(_dashboard_html(), headers={"Cache-Control": "no-cache"})


@router.get("/dashboard/data", include_in_schema=False)
async def dashboard_data(request: Request, services: Services) -> Response:
    """What the dashboard and ``batchserve status`` show, as one JSON document."""
    view, _ = ops_view(request, services)
    try:
        snapshot = await view.snapshot()
    except Unavailable as error:
        return problem(503, "unavailable", str(error), headers={"Retry-After": "1"})
    return JSON(snapshot.as_dict(), headers={"Cache-Control": "no-store"})


@cache
def _dashboard_html() -> str:
    return files("batchserve.api").joinpath("static/dashboard.html").read_text(encoding="utf-8")
