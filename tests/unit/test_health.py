"""The probes of the roles without an HTTP API (core/health.py), on a fake clock."""

from __future__ import annotations

from typing import Any

import orjson

from batchserve.core.health import RoleHealth, ops_app


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_role_is_live_while_its_loop_beats_and_stalled_after() -> None:
    """Live while starting and while beating; 503 once the loop has been quiet too long."""
    clock = Clock()
    health = RoleHealth(stall_after_s=30.0, clock=clock)
    assert health.liveness() == (True, {"status": "starting"})
    health.beat()
    clock.now += 29.0
    assert health.liveness() == (True, {"status": "ok", "since_last_beat_s": 29.0})
    clock.now += 2.0
    assert health.liveness() == (False, {"status": "stalled", "since_last_beat_s": 31.0})
    health.set_ready()
    assert health.readiness()[0] is False  # a stalled role is not ready either
    health.beat()
    assert health.liveness()[0] is True


def test_readiness_says_why_not() -> None:
    """Not ready until the role says so, and not while it drains."""
    health = RoleHealth(clock=Clock())
    assert health.readiness() == (False, {"status": "not_ready", "reason": "starting"})
    health.set_ready()
    assert health.readiness() == (True, {"status": "ok"})
    health.set_ready("draining")
    assert health.readiness() == (False, {"status": "not_ready", "reason": "draining"})


def call(app: Any, path: str) -> tuple[str, bytes]:
    seen: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.append(status)

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": "GET"}, start_response))
    return seen[0], body


def test_the_ops_app_routes_metrics_and_probes() -> None:
    """/metrics goes to the exporter, /healthz and /readyz answer from the role's health with
    200 or 503, anything else is a 404 (not the metrics, which prometheus_client's own server
    answers on every path)."""

    def metrics(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"# metrics"]

    clock = Clock()
    health = RoleHealth(stall_after_s=5.0, clock=clock)
    app = ops_app(metrics, health)
    assert call(app, "/metrics") == ("200 OK", b"# metrics")
    status, body = call(app, "/readyz")
    assert status.startswith("503") and orjson.loads(body)["reason"] == "starting"
    health.set_ready()
    health.beat()
    assert call(app, "/readyz") == ("200 OK", b'{"status":"ok"}')
    clock.now += 6.0
    status, body = call(app, "/healthz")
    assert status.startswith("503") and orjson.loads(body)["status"] == "stalled"
    assert call(app, "/")[0].startswith("404")
