"""``batchserve webhooks``: webhook delivery (the relay and the Celery worker), one process."""

from __future__ import annotations

import typer

from batchserve.core.settings import Settings


def run_webhooks_role(settings: Settings) -> None:
    if settings.embedded:
        typer.echo(
            "batchserve: the webhooks role needs servers (BATCHSERVE_*_URL); "
            "`batchserve serve` delivers webhooks in the embedded mode",
            err=True,
        )
        raise typer.Exit(2)
    from batchserve.core.metrics import serve_role_metrics
    from batchserve.workers.webhooks.worker import run_webhooks

    serve_role_metrics(settings, "webhooks")
    run_webhooks(settings, loglevel=settings.log_level)
