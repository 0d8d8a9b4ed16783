"""docker-compose.yml, checked without a Docker engine: the structure the issue asks for, and
every command a container runs parsed by the real ``batchserve`` CLI (the images it builds:
tests/unit/test_images.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from batchserve.cli.main import app
from batchserve.core.settings import Settings
from batchserve.models.registry import load_registry

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ONE_SHOT = {"migrate"}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def ours(service: dict[str, Any]) -> bool:
    """Built from this repository: its command runs under ``batchserve``."""
    return "build" in service


def commands_of(role: str) -> list[str]:
    return [name for name, s in SERVICES.items() if ours(s) and s["command"][0] == role]


def test_every_service_has_an_image_or_a_build_and_a_restart_policy() -> None:
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        expected = "no" if name in ONE_SHOT else "unless-stopped"
        assert service.get("restart") == expected, name


def test_dependencies_exist_and_wait_for_health_where_there_is_one() -> None:
    for name, service in SERVICES.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in CONDITIONS, name
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], f"{dependency} has no healthcheck"
            if dependency in ONE_SHOT:
                assert rule["condition"] == "service_completed_successfully", name
        if ours(service) and name not in ONE_SHOT:
            assert "migrate" in service["depends_on"], f"{name} may start before the schema"


def test_every_long_running_service_has_a_healthcheck_that_matches_its_port() -> None:
    for name, service in SERVICES.items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), name
        if not ours(service):
            continue
        probe = " ".join(check["test"])
        (port,) = re.findall(r"127\.0\.0\.1:(\d+)/", probe)
        command = service["command"]
        if command[0] == "api":
            assert port == command[command.index("--port") + 1] and "/readyz" in probe
        else:
            assert port == service["environment"]["BATCHSERVE_METRICS_PORT"], name
            assert "/healthz" in probe, name
            assert service["environment"]["BATCHSERVE_METRICS_HOST"] == "0.0.0.0", name


def test_the_roles_the_issue_asks_for_are_all_there() -> None:
    assert {"postgres", "rabbitmq", "redis", "migrate"} <= SERVICES.keys()
    (api,) = commands_of("api")
    assert SERVICES[api]["deploy"]["replicas"] == 2
    (batcher,) = commands_of("batcher")
    assert SERVICES[batcher]["deploy"]["replicas"] == 2  # active + hot standby
    assert len(commands_of("maintenance")) == len(commands_of("webhooks")) == 1
    served = {
        SERVICES[w]["command"][SERVICES[w]["command"].index("--model") + 1]
        for w in commands_of("worker")
    }
    assert served == set(load_registry(None).names())  # a worker service for every model
    for worker in commands_of("worker"):
        assert SERVICES[worker].get("stop_grace_period"), "a worker needs time to finish its batch"


def test_volumes_are_declared_and_data_is_kept() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in declared, f"{name} mounts undeclared {source}"
    mounts = {v.split(":")[1] for v in SERVICES["postgres"]["volumes"]}
    assert "/var/lib/postgresql/data" in mounts


@pytest.mark.parametrize("service", [n for n, s in SERVICES.items() if ours(s)])
def test_each_command_is_a_real_batchserve_command_with_valid_options(service: str) -> None:
    dockerfile = (ROOT / SERVICES[service]["build"]["dockerfile"]).read_text()
    assert re.search(r'^ENTRYPOINT \["batchserve"\]', dockerfile, re.M)
    name, *args = SERVICES[service]["command"]
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert name in commands, f"{service}: batchserve has no command {name!r}"
    # Parsing (not running) the command: an unknown option, a missing one or a bad value raises.
    params = commands[name].make_context(name, list(args)).params
    if name == "worker":
        assert params["model"] in load_registry(None).names()


def test_a_bad_option_would_be_caught() -> None:
    worker = typer.main.get_command(app).commands["worker"]  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="No such option"):
        worker.make_context("worker", ["--modle", "echo-100ms"])


def test_environment_names_real_settings() -> None:
    fields = {f"BATCHSERVE_{name.upper()}" for name in Settings.model_fields}
    for name, service in SERVICES.items():
        for key in service.get("environment") or {}:
            if key.startswith("BATCHSERVE_"):
                assert key in fields, f"{name}: {key} is no setting"


def test_only_the_api_port_is_published_and_its_operator_endpoints_stay_inside() -> None:
    published = {name: s["ports"] for name, s in COMPOSE["services"].items() if "ports" in s}
    assert published == {"api": ["8000-8001:8000"]}
    # The API's /metrics and dashboard go to the metrics port, which nothing publishes.
    assert COMPOSE["x-env"]["BATCHSERVE_METRICS_PORT"] == "9100"
