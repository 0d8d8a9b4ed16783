"""The ``batchserve`` command line: roles, admin and client commands."""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Annotated

import httpx
import typer

from batchserve.core import loops
from batchserve.core.logs import setup_logging
from batchserve.core.settings import Settings, load_settings

# Tooling that is not the product, loaded only when its command runs (or the help lists it), so
# a role process never imports the benchmarks, the test harness or their libraries.
_TOOLS = {
    "bench": ("batchserve.bench.command", "bench", "bench"),
    "chaos": ("batchserve.testing.chaos_run", "chaos", "bench"),
}


def _add_tool(name: str) -> None:
    module, function, extra = _TOOLS[name]
    try:
        command = getattr(importlib.import_module(module), function)
    except ImportError as error:
        hint = f"`batchserve {name}` needs {error.name}: pip install 'batchserve[{extra}]'"

        def command() -> None:
            typer.echo(f"batchserve: {hint}", err=True)
            raise typer.Exit(2)

        command.__doc__ = hint
    app.command(name)(command)


app = typer.Typer(
    name="batchserve",
    help="A durable, batched LLM inference service.",
    no_args_is_help=True,
    add_completion=False,
)

Host = Annotated[str, typer.Option(help="Interface to listen on")]
Port = Annotated[int, typer.Option(help="Port to listen on")]


def _settings(role: str) -> Settings:
    try:
        settings = load_settings()
    except ValueError as error:
        typer.echo(f"batchserve: bad settings: {error}", err=True)
        raise typer.Exit(2) from error
    setup_logging(role, fmt=settings.log_format, level=settings.log_level)
    return settings


def _role_settings(role: str) -> Settings:
    """A role's settings, once its database's schema is known not to be older than its code."""
    _end_with_supervisor()
    settings = _settings(role)
    from batchserve.core.migrate import wait_for_schema

    problem = wait_for_schema(settings.effective_database_url, settings.schema_wait_s)
    if problem is not None:
        typer.echo(f"batchserve {role}: {problem}", err=True)
        raise typer.Exit(2)
    return settings


def _end_with_supervisor() -> None:
    """A role ``serve`` started ends (SIGTERM: gracefully) when ``serve`` does, even killed
    outright: an API left behind would hold the port the next ``serve`` needs, and a worker
    would serve on unsupervised."""
    from batchserve.cli.supervisor import SUPERVISOR_PID

    supervisor = os.environ.pop(SUPERVISOR_PID, None)
    if supervisor is None:
        return
    from batchserve.api.processes import end_with_parent

    end_with_parent()
    if os.getppid() != int(supervisor):  # it died before we asked to be told
        typer.echo("batchserve: the serve that started this role is gone", err=True)
        raise typer.Exit(1)


def _reachable(host: str) -> str:
    """The address a client on this machine uses for a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


@app.command()
def serve(
    host: Host = "127.0.0.1",
    port: Port = 8000,
    ops_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="The dashboard and /metrics, on BATCHSERVE_METRICS_HOST (loopback); "
            "default: the port after --port, or a free one when that is taken",
        ),
    ] = None,
) -> None:
    """Every role on this machine, supervised (embedded when no servers are configured)."""
    settings = _settings("serve")
    from batchserve.cli.keys import announce_first_key
    from batchserve.cli.served import write_served

    ops = ops_port if ops_port is not None else _default_ops_port(settings.metrics_host, port)
    # What the user's next commands (keys, submit, status) should open by default.
    write_served(
        settings,
        f"http://{_reachable(host)}:{port}",
        ops_url=f"http://{_reachable(settings.metrics_host)}:{ops}",
    )

    announce_first_key(settings)
    if settings.embedded:
        from batchserve.cli.embedded import run_embedded

        loops.run(run_embedded(settings.model_copy(update={"metrics_port": ops}), host, port))
        return
    from batchserve.cli.supervisor import Supervisor, plan_children
    from batchserve.core.migrate import upgrade
    from batchserve.models.plugins import servable
    from batchserve.models.registry import load_registry

    upgrade(settings.effective_database_url)
    registry = load_registry(settings.models)
    # The API still admits requests for the others: a worker elsewhere may serve them.
    served, refused = servable(registry.specs())
    for name, reason in refused.items():
        typer.echo(f"batchserve: no worker here for {name}: {reason}", err=True)
    children = plan_children(
        host,
        port,
        [spec.name for spec in served],
        {s.name: s.slots for s in registry.specs()},
        metrics_port=settings.metrics_port,
        ops_port=ops,
    )
    raise typer.Exit(Supervisor(children).run(ready_url=f"http://{host}:{port}"))


def _default_ops_port(host: str, port: int) -> int:
    """The port after ``port`` when nothing listens there; else one the system picks (the
    server started, then died binding its operator listener to a port another process held).
    Where it went is printed, and written for ``batchserve status``."""
    import socket

    for candidate in (port + 1, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
            chosen = int(probe.getsockname()[1])
        if candidate == 0:
            typer.echo(f"batchserve: port {port + 1} is taken; operator endpoints on {chosen}")
        return chosen
    raise typer.BadParameter(f"no free port for the operator endpoints on {host}")


@app.command()
def api(
    host: Host = "127.0.0.1",
    port: Port = 8000,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Processes sharing the port, one core each (BATCHSERVE_API_PROCESSES; 1)",
        ),
    ] = None,
) -> None:
    """The HTTP API."""
    from batchserve.cli.roles import run_api

    settings = _role_settings("api")
    if processes is not None:
        settings = settings.model_copy(update={"api_processes": processes})
    run_api(settings, host, port)


@app.command()
def batcher(
    model: Annotated[list[str] | None, typer.Option(help="Model(s) to batch; default all")] = None,
) -> None:
    """The batcher: forms batches when worker slots are free (hot standby if one runs already)."""
    from batchserve.cli.roles import run_batcher

    loops.run(run_batcher(_role_settings("batcher"), model))


@app.command()
def worker(
    model: Annotated[str, typer.Option(help="The model this worker serves")],
    slots: Annotated[int | None, typer.Option(help="Batches run at once (processes)")] = None,
    standby: Annotated[
        str | None,
        typer.Option(help="A standby process per slot: auto, on, off (BATCHSERVE_WORKER_STANDBY)"),
    ] = None,
) -> None:
    """A Celery worker for one model; each slot runs one batch at a time."""
    from batchserve.models.registry import load_registry
    from batchserve.workers.worker_main import run_worker

    settings = _role_settings("worker")
    if standby is not None:
        if standby not in ("auto", "on", "off"):
            typer.echo("batchserve: --standby is auto, on or off", err=True)
            raise typer.Exit(2)
        settings = settings.model_copy(update={"worker_standby": standby})
    spec = load_registry(settings.models).get(model)
    if spec is None:
        typer.echo(f"batchserve: unknown model {model!r}", err=True)
        raise typer.Exit(2)
    from batchserve.models.plugins import plugin_for

    reason = plugin_for(spec).missing()
    if reason is not None:
        typer.echo(f"batchserve: cannot serve {model}: {reason}", err=True)
        raise typer.Exit(2)
    if settings.embedded:
        typer.echo("batchserve: a worker needs servers (BATCHSERVE_*_URL)", err=True)
        raise typer.Exit(2)
    run_worker(settings, spec, slots=slots or spec.slots, loglevel=settings.log_level)


@app.command()
def maintenance() -> None:
    """Expire overdue requests, reap expired leases, republish, prune idempotency keys."""
    from batchserve.cli.roles import run_maintenance

    loops.run(run_maintenance(_role_settings("maintenance")))


@app.command()
def webhooks() -> None:
    """Deliver webhooks: relay due deliveries to the webhooks queue and send them, signed."""
    from batchserve.cli.webhooks_role import run_webhooks_role

    run_webhooks_role(_role_settings("webhooks"))


@app.command()
def migrate() -> None:
    """Upgrade the database schema to the latest revision."""
    from batchserve.cli.served import admin_settings, opening
    from batchserve.core.migrate import current, upgrade

    _settings("migrate")  # logging, and bad settings refused
    settings = admin_settings()
    with opening(settings.effective_database_url):
        upgrade(settings.effective_database_url)
        typer.echo(f"database at revision {current(settings.effective_database_url)}")


@app.command()
def submit(
    text: Annotated[str, typer.Argument(help="The prompt")],
    model: Annotated[str, typer.Option(help="Model name")] = "echo-100ms",
    url: Annotated[
        str | None,
        typer.Option(envvar="BATCHSERVE_URL", help="Service URL (default: the last `serve`'s)"),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens to generate")] = 64,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the result; 0 = don't")] = 30.0,
    idempotency_key: Annotated[str | None, typer.Option(help="Idempotency-Key header")] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="BATCHSERVE_API_KEY", help="API key (bsk_...)")
    ] = None,
) -> None:
    """Submit one prompt and print the request (with its result when --wait)."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    from batchserve.cli.served import client_url, reaching

    base = client_url(url)
    body = {"model": model, "input": text, "params": {"max_tokens": max_tokens}}
    with reaching(base), httpx.Client(base_url=base, timeout=wait + 10) as client:
        response = client.post("/v1/requests", json=body, headers=headers)
        if response.status_code != 202:
            typer.echo(response.text, err=True)
            raise typer.Exit(1)
        request = response.json()
        if wait > 0:
            auth = {k: v for k, v in headers.items() if k == "Authorization"}
            path = f"/v1/requests/{request['id']}"
            request = client.get(path, params={"wait": wait}, headers=auth).json()
    typer.echo(json.dumps(request, indent=2))


from batchserve.cli.analysis import capacity as _capacity  # noqa: E402
from batchserve.cli.analysis import simulate as _simulate  # noqa: E402

app.command("simulate")(_simulate)
app.command("capacity")(_capacity)


from batchserve.cli.batch import app as _batch_app  # noqa: E402

app.add_typer(_batch_app, name="batch")

from batchserve.cli.keys import app as _keys_app  # noqa: E402

app.add_typer(_keys_app, name="keys")

from batchserve.cli.status import status as _status  # noqa: E402

app.command("status")(_status)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    asked = args[0] if args else "--help"
    for name in _TOOLS:
        if asked in (name, "--help", "-h"):
            _add_tool(name)
    app(args=args, prog_name="batchserve")


if __name__ == "__main__":
    main()
