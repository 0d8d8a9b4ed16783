"""Liveness and readiness of the roles without an HTTP API, served beside their metrics.

The batcher, maintenance, webhooks and the workers answer on their exporter's port
(``BATCHSERVE_METRICS_PORT``): ``/metrics``, ``/healthz`` and ``/readyz``, each a small JSON
document with 200 or 503, for an orchestrator's probes.

- **Live**: the role's own loop keeps beating (its event loop for the batcher, maintenance and
  webhooks; the slot heartbeat for a worker). A loop that stops for ``stall_after_s`` (a
  deadlock, a blocked event loop) makes ``/healthz`` answer 503 and the orchestrator restarts
  the process. Before its first beat a role is starting, and live.
- **Ready**: the role has started its work (a worker: every pool process has loaded its model
  and the slots are announced) and is not draining.

One :class:`RoleHealth` per process (:func:`role_health`); the exporter serves it from a
thread, the role's code sets it from wherever it runs.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson
from prometheus_client.exposition import ThreadingWSGIServer

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class RoleHealth:
    def __init__(
        self, *, stall_after_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stall_after_s = stall_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_beat: float | None = None
        self._ready = False
        self._why_not = "starting"

    def beat(self) -> None:
        """The role's loop ran."""
        with self._lock:
            self._last_beat = self._clock()

    def set_ready(self, why_not: str | None = None) -> None:
        """Ready (``None``), or not, saying why (``draining``, ``loading the model``)."""
        with self._lock:
            self._ready = why_not is None
            self._why_not = why_not or ""

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            if self._last_beat is None:
                return True, {"status": "starting"}
            quiet_s = self._clock() - self._last_beat
        if quiet_s > self.stall_after_s:
            return False, {"status": "stalled", "since_last_beat_s": round(quiet_s, 1)}
        return True, {"status": "ok", "since_last_beat_s": round(quiet_s, 1)}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        live, body = self.liveness()
        with self._lock:
            ready, why_not = self._ready, self._why_not
        if not live:
            return False, body
        if not ready:
            return False, {"status": "not_ready", "reason": why_not}
        return True, {"status": "ok"}

    async def beat_forever(self, period_s: float = 1.0) -> None:
        """Beat from the running event loop: a loop that blocks stops beating."""
        while True:
            self.beat()
            await asyncio.sleep(period_s)


_health: RoleHealth | None = None


def role_health() -> RoleHealth:
    """This process's health (created on first use)."""
    global _health
    if _health is None:
        _health = RoleHealth()
    return _health


def ops_app(metrics_app: WsgiApp, health: RoleHealth) -> WsgiApp:
    """``/metrics`` from ``metrics_app``; ``/healthz`` and ``/readyz`` from ``health``."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in ("/healthz", "/readyz"):
            ok, body = health.liveness() if path == "/healthz" else health.readiness()
            return _json(start_response, "200 OK" if ok else "503 Service Unavailable", body)
        return _json(start_response, "404 Not Found", {"status": "not_found", "path": path})

    return app


def _json(start_response: Callable[..., Any], status: str, body: dict[str, Any]) -> list[bytes]:
    data = orjson.dumps(body)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    start_response(status, headers)
    return [data]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds are not news."""


def serve_ops(app: WsgiApp, host: str, port: int) -> ThreadingWSGIServer:
    """Serve ``app`` on ``host:port`` from a daemon thread."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, app, server_class=Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="ops-http", daemon=True).start()
    return server
