"""``batchserve serve`` with servers: the roles it supervises, and their exporter ports."""

from __future__ import annotations

from batchserve.cli.supervisor import plan_children


def test_each_role_but_the_api_gets_an_exporter_port_of_its_own() -> None:
    children = plan_children("127.0.0.1", 8000, ["a", "b"], {"a": 2}, metrics_port=9100)
    (api,) = [c for c in children if c.name == "api"]
    assert "BATCHSERVE_METRICS_PORT" not in api.env  # the API serves /metrics on its own port
    ports = {c.name: c.env["BATCHSERVE_METRICS_PORT"] for c in children if c is not api}
    assert sorted(ports) == ["batcher", "maintenance", "webhooks", "worker:a", "worker:b"]
    assert sorted(ports.values()) == [str(p) for p in range(9100, 9105)]


def test_without_a_metrics_port_no_role_gets_one() -> None:
    children = plan_children("127.0.0.1", 8000, ["a"], {"a": 1})
    assert all(not c.env for c in children)
