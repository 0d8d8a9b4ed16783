"""Settings, read once from the environment (prefix ``BATCHSERVE_``) and passed down."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_HOME = Path.home() / ".local" / "share" / "batchserve"


class Settings(BaseSettings):
    """Every knob batchserve reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="BATCHSERVE_", extra="ignore")

    database_url: str | None = None
    broker_url: str | None = None
    redis_url: str | None = None
    # The AMQP heartbeat of every connection to RabbitMQ (the API's and batcher's, Celery's),
    # unless the broker URL sets ``heartbeat=`` itself. RabbitMQ drops a connection that has
    # been silent for 2-3 intervals, and only then hands a cut-off batcher's queues to the
    # standby: at 5 s that is 10-15 s, at the libraries' 60 s default 2-3 minutes. 0: none.
    broker_heartbeat_s: int = Field(default=5, ge=0, le=600, description="AMQP heartbeat")
    models: Path | None = Field(default=None, description="Path of the model registry file")

    # Prefix of every queue, Redis key and channel, so deployments and test runs can share servers.
    namespace: str = ""
    home: Path = Field(default=DEFAULT_HOME, description="Embedded database, model cache")
    env: Literal["development", "production"] = "development"
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    # Every role's Prometheus exporter; the API's operator listener (/metrics, /dashboard, never
    # on its public port). Unset: none.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"
    # A role without an HTTP API answers 503 on its exporter's /healthz once its own loop has
    # not run for this long (core/health.py), so an orchestrator restarts it.
    health_stall_s: float = Field(default=30.0, gt=0)
    # A role that finds the database's schema older than its code waits this long for it to be
    # migrated (a migrate Job running beside it) before it refuses to start; 0: at once.
    schema_wait_s: float = Field(default=0.0, ge=0)

    # Admission limits.
    max_body_bytes: int = 1_048_576
    max_input_chars: int = 200_000
    default_timeout_s: float = 600.0
    max_timeout_s: float = 7 * 86_400.0
    max_wait_s: float = 60.0
    # A connection is closed when its request line and headers have not all arrived this long
    # after its first byte (slowloris), or its body this long after its headers.
    http_header_timeout_s: float = Field(default=10.0, gt=0)
    http_body_timeout_s: float = Field(default=60.0, gt=0)
    idempotency_retention_s: float = 86_400.0
    # Finished requests, with their logged transitions and settled webhook deliveries, are
    # deleted by maintenance this long after they finished (at least as long as idempotency
    # keys are kept, so that a retry with a key still finds its request).
    request_retention_s: float = Field(default=30 * 86_400.0, gt=0)
    # A file uploaded without expires_after, and a batch job's output and error files written
    # without output_expires_after, expire this long after they are created (OpenAI's default
    # for batch files); maintenance then deletes them. 0: kept until deleted.
    file_retention_s: int = Field(default=30 * 86_400, ge=0)

    # Tenants. ``required``: every /v1 call needs an API key; ``disabled``: every caller is the
    # tenant ``anonymous`` (a single-user development server).
    auth: Literal["required", "disabled"] = "required"
    # Processes of one ``batchserve api``, sharing its port (api/processes.py): one process
    # serves HTTP on one core.
    api_processes: int = Field(default=1, ge=1, le=64)
    api_db_pool_size: int = Field(
        default=10, ge=1, description="The API's Postgres connections (a process's pool)"
    )
    api_db_max_overflow: int = Field(
        default=0,
        ge=0,
        description="Connections the API may open beyond its pool, closed when returned",
    )
    key_cache_s: float = Field(
        default=5.0, ge=0, description="How long the API trusts a key lookup (revocation delay)"
    )
    # Quotas of a tenant that sets none of its own (``batchserve keys create --max-queued ...``).
    tenant_max_queued: int = Field(
        default=10_000, ge=1, description="Unfinished interactive requests per tenant"
    )
    tenant_rate_per_s: float = Field(
        default=0.0, ge=0, description="Submissions per second per tenant; 0: unlimited"
    )
    tenant_burst: int = Field(default=0, ge=0, description="Token-bucket depth; 0: 2 s of rate")
    tenant_max_bulk_in_flight: int = Field(
        default=200_000, ge=1, description="Unfinished bulk requests per tenant"
    )
    # Per model, the interactive backlog is bounded by this many seconds of its capacity.
    max_queue_s: float = Field(default=120.0, gt=0, description="Backlog bound, in seconds")
    min_backlog: int = Field(
        default=1_000, ge=1, description="Backlog always accepted (no workers yet, cold start)"
    )

    # Execution.
    max_failures: int = Field(
        default=3, description="Attempt budget: failures charged to a request"
    )
    lease_s: float = Field(
        default=2.0, description="Lease of a running batch, renewed by heartbeat"
    )
    dispatch_grace_s: float = Field(default=5.0, description="Time for a dispatched batch to start")
    republish_after_s: float = 5.0
    worker_heartbeat_s: float = 0.5
    worker_ttl_s: float = 3.0
    # An engine worker told to stop lets its running sequences finish for up to this long
    # (what is still running then is requeued); keep the orchestrator's grace period longer.
    engine_drain_s: float = Field(default=60.0, ge=0, description="Engine drain on SIGTERM")
    # A second pool process per slot takes the next batch's lease while the running model is
    # still busy, so a slot passes from one batch to the next without a hand-over or a lease
    # round trip (batchserve/workers/slot_gate.py). It costs a second copy of the model per slot:
    # ``auto`` turns it on for backends that hold no weights (fixed, echo) and off for
    # transformers, whose batches take long enough that the ~10 ms saved is a small share of
    # each.
    worker_standby: Literal["auto", "on", "off"] = Field(
        default="auto", description="A standby pool process per slot"
    )

    # Webhooks. The allowlist exempts hosts (names or CIDRs) from the SSRF guard, for development.
    webhook_allowlist: str = ""
    webhook_retry_schedule: str = Field(
        default="5,30,120,600,1800,7200,18000,36000,86400",
        description="Seconds between delivery attempts; one attempt more than delays",
    )
    webhook_timeout_s: float = Field(default=10.0, gt=0, description="One attempt, all told")
    webhook_lease_s: float = Field(
        default=30.0, gt=0, description="An attempt not finished by then is sent again"
    )
    webhook_concurrency: int = Field(default=16, ge=1, description="Attempts in flight at once")
    webhook_resolve_timeout_s: float = Field(default=2.0, gt=0)
    webhook_secret_grace_s: float = Field(
        default=86_400.0, ge=0, description="A rotated-out secret keeps signing this long"
    )
    # Fernet key(s) that encrypt webhook secrets at rest, comma-separated: the first encrypts,
    # all decrypt (to rotate the key). Unset in development: a key file under ``home``.
    secret_key: SecretStr | None = None

    # Bulk jobs (the OpenAI Batch API) and the synchronous OpenAI endpoints.
    max_file_bytes: int = Field(
        default=200 * 1024 * 1024, ge=1, description="Largest file POST /v1/files accepts"
    )
    batch_max_requests: int = Field(
        default=50_000, ge=1, le=1 << 20, description="Most lines in one batch input file"
    )
    batch_max_line_bytes: int = Field(
        default=1_048_576, ge=1, description="Longest line of a batch input file"
    )
    batch_min_window_s: float = Field(
        default=86_400.0, gt=0, description="Shortest completion_window accepted (24h)"
    )
    batch_max_window_s: float = Field(
        default=86_400.0, gt=0, description="Longest completion_window accepted (24h)"
    )
    batch_ingest_chunk: int = Field(
        default=5_000, ge=1, description="Requests persisted and published per round"
    )
    openai_timeout_s: float = Field(
        default=600.0, gt=0, description="How long /v1/chat/completions waits for its answer"
    )

    # Token streams (``GET /v1/requests/{id}/stream``, ``stream: true``): each request's token
    # log (a Redis Stream) lives this long after its last write, capped at this many entries
    # (about one an engine step); past either, a stream replays the stored result instead.
    token_log_ttl_s: float = Field(
        default=3600.0, ge=1, description="How long a request's token log is kept"
    )
    # Once the request has ended, its log is kept only this long (for a stream broken near
    # the end to resume); a stream opened later replays the stored result.
    token_log_linger_s: float = Field(
        default=60.0, ge=1, description="How long a finished request's token log is kept"
    )
    token_log_max_entries: int = Field(
        default=10_000, ge=16, description="Most entries in one request's token log"
    )

    # Test-only fault injection points, e.g. "exit_after_commit". Never set in production.
    faults: str = ""

    @model_validator(mode="after")
    def _servers_all_or_none(self) -> Settings:
        configured = [self.database_url, self.broker_url, self.redis_url]
        if any(configured) and not all(configured):
            raise ValueError(
                "set all of BATCHSERVE_DATABASE_URL, BATCHSERVE_BROKER_URL and "
                "BATCHSERVE_REDIS_URL, or none of them for the embedded mode"
            )
        if self.env == "production" and self.embedded:
            raise ValueError(
                "the embedded mode is for development; configure servers in production"
            )
        if self.env == "production" and not self.secret_key_list:
            raise ValueError(
                "set BATCHSERVE_SECRET_KEY in production (it encrypts webhook secrets at rest); "
                "make one with: python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'"
            )
        _check_fernet_keys(self.secret_key_list)
        if not self.retry_schedule_s and self.webhook_retry_schedule.strip():
            raise ValueError("BATCHSERVE_WEBHOOK_RETRY_SCHEDULE: comma-separated seconds")
        if self.batch_min_window_s > self.batch_max_window_s:
            raise ValueError("BATCHSERVE_BATCH_MIN_WINDOW_S exceeds BATCHSERVE_BATCH_MAX_WINDOW_S")
        if self.request_retention_s < self.idempotency_retention_s:
            raise ValueError(
                "BATCHSERVE_REQUEST_RETENTION_S must be at least BATCHSERVE_IDEMPOTENCY_RETENTION_S"
                f" ({self.idempotency_retention_s:g} s): a retry with an idempotency key must"
                " still find its request"
            )
        if self.webhook_lease_s <= self.webhook_timeout_s:
            raise ValueError("BATCHSERVE_WEBHOOK_LEASE_S must exceed BATCHSERVE_WEBHOOK_TIMEOUT_S")
        return self

    @property
    def embedded(self) -> bool:
        """True when no servers are configured: SQLite file and in-process queue."""
        return self.database_url is None

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.home / 'batchserve.sqlite3'}"

    @cached_property
    def fault_points(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.faults.split(",") if p.strip())

    @property
    def retry_schedule_s(self) -> tuple[float, ...]:
        """Delays between webhook attempts; empty when the setting does not parse."""
        try:
            delays = tuple(float(p) for p in self.webhook_retry_schedule.split(",") if p.strip())
        except ValueError:
            return ()
        return delays if all(d >= 0 for d in delays) else ()

    @property
    def secret_key_list(self) -> list[str]:
        if self.secret_key is None:
            return []
        return [k.strip() for k in self.secret_key.get_secret_value().split(",") if k.strip()]

    @property
    def key_prefix(self) -> str:
        """Prefix of Redis keys (worker slots, rate limits)."""
        return self.namespace or "batchserve"

    def name(self, *parts: str) -> str:
        """A namespaced name for a queue, key or channel: ``ns.part.part``."""
        joined = ".".join(parts)
        return f"{self.namespace}.{joined}" if self.namespace else joined


def _check_fernet_keys(keys: list[str]) -> None:
    # Checked here, so a bad key stops every role at start-up instead of the first delivery.
    from cryptography.fernet import Fernet

    for n, key in enumerate(keys, start=1):
        try:
            Fernet(key.encode())
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"BATCHSERVE_SECRET_KEY: key {n} is not a Fernet key (32 url-safe base64 bytes)"
            ) from error


def load_settings() -> Settings:
    return Settings()
