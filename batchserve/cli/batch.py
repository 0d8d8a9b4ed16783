"""``batchserve batch``: submit a JSONL file as a bulk job, follow it, fetch its results."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from batchserve.cli.served import client_url, reaching

app = typer.Typer(
    help="Bulk jobs in the OpenAI Batch format: submit a JSONL file, follow it, fetch results.",
    no_args_is_help=True,
)

ENDED = {"completed", "failed", "expired", "cancelled"}
Url = Annotated[
    str | None,
    typer.Option(envvar="BATCHSERVE_URL", help="Service URL (default: the last `serve`'s)"),
]
ApiKey = Annotated[
    str | None,
    typer.Option(envvar="BATCHSERVE_API_KEY", help="API key (bsk_...)"),
]
BatchId = Annotated[str, typer.Argument(help="The batch id (batch_...)")]


@contextlib.contextmanager
def _client(
    url: str | None, api_key: str | None, timeout_s: float = 60.0
) -> Iterator[httpx.Client]:
    base = client_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with reaching(base), httpx.Client(base_url=base, headers=headers, timeout=timeout_s) as client:
        yield client


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        typer.echo(f"batchserve: {response.status_code} {response.text}", err=True)
        raise typer.Exit(1)
    body: dict[str, Any] = response.json()
    return body


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSONL input file")],
    endpoint: Annotated[str, typer.Option(help="Endpoint every line calls")] = (
        "/v1/chat/completions"
    ),
    completion_window: Annotated[str, typer.Option(help="Time the job may take")] = "24h",
    webhook_url: Annotated[str | None, typer.Option(help="POST batch.* events here")] = None,
    wait: Annotated[bool, typer.Option(help="Follow the job with a progress bar")] = False,
    url: Url = None,
    api_key: ApiKey = None,
) -> None:
    """Upload FILE, create a bulk job from it, and (with --wait) follow it to its end."""
    with _client(url, api_key, timeout_s=600.0) as client, file.open("rb") as handle:
        uploaded = _ok(
            client.post("/v1/files", files={"file": (file.name, handle)}, data={"purpose": "batch"})
        )
        body: dict[str, Any] = {
            "input_file_id": uploaded["id"],
            "endpoint": endpoint,
            "completion_window": completion_window,
        }
        if webhook_url:
            body["webhook_url"] = webhook_url
        batch = _ok(client.post("/v1/batches", json=body))
        if not wait:
            typer.echo(json.dumps(batch, indent=2))
            return
        batch = _follow(client, batch)
    _summary(batch)
    if batch["status"] != "completed":
        raise typer.Exit(1)


def _follow(client: httpx.Client, batch: dict[str, Any], poll_s: float = 0.5) -> dict[str, Any]:
    """Poll the job, drawing a bar of finished requests (completed + failed) of the total."""
    console = Console(stderr=True)
    columns = (
        TextColumn("[bold]{task.fields[status]:<11}"),
        BarColumn(),
        TextColumn("{task.completed:>7,.0f}/{task.fields[of]}"),
        TextColumn("[green]{task.fields[ok]:,} ok[/] [red]{task.fields[failed]:,} failed[/]"),
        TextColumn("{task.fields[rate]:>7.0f} req/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(
            batch["id"], total=None, status="", ok=0, failed=0, rate=0.0, of="?"
        )
        started = time.monotonic()
        while True:
            counts = batch["request_counts"]
            done = counts["completed"] + counts["failed"]
            elapsed = max(1e-6, time.monotonic() - started)
            progress.update(
                task,
                total=counts["total"] or None,
                completed=done,
                status=batch["status"],
                ok=counts["completed"],
                failed=counts["failed"],
                rate=done / elapsed,
                of=f"{counts['total']:,}" if counts["total"] else "?",
            )
            if batch["status"] in ENDED:
                return batch
            time.sleep(poll_s)
            batch = _ok(client.get(f"/v1/batches/{batch['id']}"))


def _summary(batch: dict[str, Any]) -> None:
    counts = batch["request_counts"]
    took = ""
    ended = batch.get(f"{batch['status']}_at")
    if ended and batch.get("created_at"):
        took = f" in {ended - batch['created_at']} s"
    typer.echo(
        f"{batch['id']} {batch['status']}{took}: {counts['completed']} completed, "
        f"{counts['failed']} failed of {counts['total']}"
    )
    for error in (batch.get("errors") or {}).get("data", [])[:20]:
        typer.echo(f"  line {error.get('line')}: {error.get('code')}: {error.get('message')}")
    if batch.get("output_file_id") or batch.get("error_file_id"):
        typer.echo(
            f"results: batchserve batch results {batch['id']} -o out.jsonl --errors errors.jsonl"
        )


@app.command()
def status(batch_id: BatchId, url: Url = None, api_key: ApiKey = None) -> None:
    """Print a job as GET /v1/batches/{id} shows it."""
    with _client(url, api_key) as client:
        typer.echo(json.dumps(_ok(client.get(f"/v1/batches/{batch_id}")), indent=2))


@app.command()
def cancel(batch_id: BatchId, url: Url = None, api_key: ApiKey = None) -> None:
    """Cancel a job: unfinished requests are cancelled, finished ones are kept."""
    with _client(url, api_key) as client:
        typer.echo(json.dumps(_ok(client.post(f"/v1/batches/{batch_id}/cancel")), indent=2))


@app.command()
def results(
    batch_id: BatchId,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write the output file here")
    ] = None,
    errors: Annotated[Path | None, typer.Option(help="Write the error file here")] = None,
    url: Url = None,
    api_key: ApiKey = None,
) -> None:
    """Download a finished job's output file (to -o, or stdout) and error file (--errors)."""
    with _client(url, api_key, timeout_s=600.0) as client:
        batch = _ok(client.get(f"/v1/batches/{batch_id}"))
        if batch["status"] not in ENDED:
            typer.echo(f"batchserve: {batch_id} is {batch['status']}; no results yet", err=True)
            raise typer.Exit(1)
        for file_id, path, kind in (
            (batch.get("output_file_id"), output, "output"),
            (batch.get("error_file_id"), errors, "error"),
        ):
            if path is None and kind == "error":
                continue
            content = _download(client, file_id)
            if path is None:
                typer.echo(content.decode(), nl=False)
                continue
            path.write_bytes(content)
            lines = content.count(b"\n")
            typer.echo(f"{kind}: {lines} lines -> {path}", err=True)


def _download(client: httpx.Client, file_id: str | None) -> bytes:
    if not file_id:
        return b""
    response = client.get(f"/v1/files/{file_id}/content")
    if response.status_code >= 400:
        typer.echo(f"batchserve: {response.status_code} {response.text}", err=True)
        raise typer.Exit(1)
    return response.content
