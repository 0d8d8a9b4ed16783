"""What ``serve`` chose is what the user's next commands open (batchserve/cli/served.py)."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
import typer

from batchserve.cli.served import (
    admin_settings,
    client_url,
    ops_url,
    reaching,
    read_served,
    write_served,
)
from batchserve.core.settings import Settings

SERVERS = {
    "BATCHSERVE_DATABASE_URL": "postgresql+psycopg://app:s3cret@db.internal:5432/prod",
    "BATCHSERVE_BROKER_URL": "amqp://guest:guest@mq.internal:5672//",
    "BATCHSERVE_REDIS_URL": "redis://cache.internal:6379/0",
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in (*SERVERS, "BATCHSERVE_URL", "BATCHSERVE_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("BATCHSERVE_HOME", str(tmp_path))
    return tmp_path


def _serve_on_servers(home: Path, url: str) -> Path:
    return write_served(
        Settings(
            home=home,
            namespace="blue",
            database_url=SERVERS["BATCHSERVE_DATABASE_URL"],
            broker_url=SERVERS["BATCHSERVE_BROKER_URL"],
            redis_url=SERVERS["BATCHSERVE_REDIS_URL"],
        ),
        url,
    )


def test_without_a_serve_the_defaults_hold(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert client_url(None) == "http://127.0.0.1:8000"
    settings = admin_settings()
    assert settings.embedded
    line = capsys.readouterr().err
    assert f"database sqlite+aiosqlite:///{home}/batchserve.sqlite3 (embedded)" in line


def test_admin_commands_open_the_database_the_last_serve_runs_on(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _serve_on_servers(home, "http://127.0.0.1:8400")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it may hold a password
    settings = admin_settings()
    assert settings.database_url == SERVERS["BATCHSERVE_DATABASE_URL"]
    assert settings.broker_url == SERVERS["BATCHSERVE_BROKER_URL"]
    assert settings.namespace == "blue"
    line = capsys.readouterr().err
    assert "s3cret" not in line  # never printed
    assert "postgresql+psycopg://app:***@db.internal:5432/prod" in line
    assert "`batchserve serve` on http://127.0.0.1:8400" in line and str(path) in line


def test_the_environment_wins_over_the_file(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _serve_on_servers(home, "http://127.0.0.1:8400")
    mine = "postgresql+psycopg://postgres@127.0.0.1:5432/mine"
    monkeypatch.setenv("BATCHSERVE_DATABASE_URL", mine)
    monkeypatch.setenv("BATCHSERVE_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
    monkeypatch.setenv("BATCHSERVE_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert admin_settings().database_url == mine
    assert "(BATCHSERVE_DATABASE_URL)" in capsys.readouterr().err
    assert client_url("http://10.0.0.5:9000/") == "http://10.0.0.5:9000"  # --url / BATCHSERVE_URL
    assert client_url(None) == "http://127.0.0.1:8400"


def test_an_embedded_serve_records_its_url_and_no_servers(home: Path) -> None:
    write_served(Settings(home=home), "http://127.0.0.1:8401")
    served = read_served(Settings(home=home))
    assert served is not None and served.url == "http://127.0.0.1:8401" and served.servers == {}
    assert client_url(None) == "http://127.0.0.1:8401"
    assert admin_settings().embedded


def test_an_unreadable_file_is_as_if_there_were_none(home: Path) -> None:
    (home / "serve.json").write_text("{not json")
    assert read_served(Settings(home=home)) is None
    assert client_url(None) == "http://127.0.0.1:8000"


def test_a_server_that_cannot_be_reached_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited, reaching("http://127.0.0.1:9"):
        raise httpx.ConnectError("All connection attempts failed")
    assert exited.value.exit_code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("batchserve: cannot reach http://127.0.0.1:9 (All connection attempts")


def test_a_database_that_cannot_be_opened_is_one_line(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from batchserve.cli.main import app

    monkeypatch.setenv("BATCHSERVE_DATABASE_URL", f"sqlite:///{home}/no/such/dir/x.sqlite3")
    monkeypatch.setenv("BATCHSERVE_BROKER_URL", "amqp://guest:guest@127.0.0.1:1//")
    monkeypatch.setenv("BATCHSERVE_REDIS_URL", "redis://127.0.0.1:1/0")
    for args in (["migrate"], ["keys", "list"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 1, result.output
        assert f"batchserve: cannot open sqlite:///{home}/no/such/dir/x.sqlite3" in result.stderr
        assert "Traceback" not in result.output


def test_status_reads_the_ops_port_the_last_serve_recorded(home: Path) -> None:
    assert ops_url(None) == "http://127.0.0.1:8001"  # no serve yet: the port after 8000
    write_served(Settings(home=home), "http://127.0.0.1:8401", ops_url="http://127.0.0.1:8402")
    assert ops_url(None) == "http://127.0.0.1:8402"
    assert ops_url("http://10.0.0.5:9100/") == "http://10.0.0.5:9100"  # the shell wins
