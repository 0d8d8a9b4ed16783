"""What ``batchserve serve`` chose, so that the commands a user types next agree with it.

``serve`` writes ``<BATCHSERVE_HOME>/serve.json`` when it starts: the URL it listens on and the
servers it runs on (or that it is embedded). The client commands (``submit``, ``batch``,
``status``) and the admin commands (``keys``, ``capacity --model``) read it when the shell says
nothing itself, so that ``make run PORT=8400`` followed by ``batchserve keys create`` opens the
server's database and ``batchserve submit`` finds its port. What the shell says wins:
``--url``, then ``BATCHSERVE_URL``, then the file, then ``http://127.0.0.1:8000``; any
``BATCHSERVE_*_URL`` in the environment, then the file, then the embedded database.

Only these commands read the file: a role process never does (its settings are its
environment alone). The file may hold a database password, so only its owner can read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import typer

from batchserve.core.settings import Settings, load_settings

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_OPS_URL = "http://127.0.0.1:8001"
FILE_NAME = "serve.json"
SERVER_KEYS = ("database_url", "broker_url", "redis_url")


@dataclass(frozen=True)
class Served:
    path: Path
    url: str
    servers: dict[str, str]  # empty: embedded
    pid: int
    started_at: float
    ops_url: str | None = None  # the dashboard and /metrics (never on the public port)


def served_path(settings: Settings) -> Path:
    return settings.home / FILE_NAME


def write_served(settings: Settings, url: str, ops_url: str | None = None) -> Path:
    """Record what this ``serve`` runs on, readable by its owner only."""
    path = served_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    servers = {} if settings.embedded else {k: str(getattr(settings, k)) for k in SERVER_KEYS}
    if servers and settings.namespace:
        servers["namespace"] = settings.namespace
    document = {
        "url": url,
        "ops_url": ops_url,
        "servers": servers,
        "pid": os.getpid(),
        "started_at": time.time(),
    }
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(document, handle, indent=2)
    temporary.replace(path)
    return path


def read_served(settings: Settings) -> Served | None:
    path = served_path(settings)
    try:
        document: dict[str, Any] = json.loads(path.read_text())
        return Served(
            path=path,
            url=str(document["url"]),
            servers={str(k): str(v) for k, v in dict(document.get("servers") or {}).items()},
            pid=int(document.get("pid", 0)),
            started_at=float(document.get("started_at", 0.0)),
            ops_url=str(document["ops_url"]) if document.get("ops_url") else None,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _last_served() -> Served | None:
    try:
        return read_served(load_settings())
    except ValueError:  # settings the environment makes invalid: no file to trust either
        return None


def client_url(explicit: str | None) -> str:
    """The service URL a client command talks to (``--url`` or ``BATCHSERVE_URL`` arrive as
    ``explicit``)."""
    if explicit:
        return explicit.rstrip("/")
    served = _last_served()
    return served.url if served is not None else DEFAULT_URL


def ops_url(explicit: str | None) -> str:
    """Where the operator endpoints are (``--ops-url`` or ``BATCHSERVE_OPS_URL`` arrive as
    ``explicit``): else the last ``serve``'s, else the port after the default API port's."""
    if explicit:
        return explicit.rstrip("/")
    served = _last_served()
    if served is not None and served.ops_url:
        return served.ops_url
    return DEFAULT_OPS_URL


def admin_settings() -> Settings:
    """The settings of an admin command: the environment's, or else those of the last
    ``serve`` (its servers), and one line on stderr naming the database it opens."""
    try:
        settings = load_settings()
    except ValueError as error:
        typer.echo(f"batchserve: bad settings: {error}", err=True)
        raise typer.Exit(2) from error
    source = "BATCHSERVE_DATABASE_URL" if not settings.embedded else "embedded"
    # Settings come from the environment alone: not embedded means the shell named servers.
    served = read_served(settings) if settings.embedded else None
    if served is not None and served.servers:
        settings = settings.model_copy(update=served.servers)
        source = f"the servers of `batchserve serve` on {served.url}, from {served.path}"
    typer.echo(
        f"batchserve: database {redacted(settings.effective_database_url)} ({source})", err=True
    )
    return settings


def redacted(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).render_as_string(hide_password=True)


@contextlib.contextmanager
def reaching(url: str) -> Iterator[None]:
    """Turn a server that cannot be reached into one line saying which URL was tried."""
    try:
        yield
    except httpx.TransportError as error:
        reason = str(error) or type(error).__name__
        typer.echo(
            f"batchserve: cannot reach {url} ({reason}); is the server running? "
            "(--url or BATCHSERVE_URL names another)",
            err=True,
        )
        raise typer.Exit(1) from None


@contextlib.contextmanager
def opening(database_url: str) -> Iterator[None]:
    """Turn a database that cannot be opened into one line naming it (password hidden)."""
    from sqlalchemy.exc import OperationalError

    try:
        yield
    except (OperationalError, OSError) as error:
        reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        typer.echo(f"batchserve: cannot open {redacted(database_url)}: {reason}", err=True)
        raise typer.Exit(1) from None
