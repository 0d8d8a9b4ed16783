"""``batchserve serve`` with servers: the roles it supervises, and their exporter ports."""

from __future__ import annotations

from batchserve.cli.supervisor import plan_children


def test_each_role_gets_an_exporter_port_of_its_own_and_the_api_its_ops_port() -> None:
    children = plan_children(
        "127.0.0.1", 8000, ["a", "b"], {"a": 2}, metrics_port=9100, ops_port=8001
    )
    (api,) = [c for c in children if c.name == "api"]
    # The API's /metrics and dashboard: on the ops port, never on its public one.
    assert api.env == {"BATCHSERVE_METRICS_PORT": "8001"}
    ports = {c.name: c.env["BATCHSERVE_METRICS_PORT"] for c in children if c is not api}
    assert sorted(ports) == ["batcher", "maintenance", "webhooks", "worker:a", "worker:b"]
    assert sorted(ports.values()) == [str(p) for p in range(9100, 9105)]


def test_without_a_metrics_port_no_role_gets_one() -> None:
    children = plan_children("127.0.0.1", 8000, ["a"], {"a": 1})
    assert all(not c.env for c in children)
