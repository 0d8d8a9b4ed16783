"""Settings, read once from the environment (prefix ``BATCHSERVE_``) and passed down."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_HOME = Path.home() / ".local" / "share" / "batchserve"


class Settings(BaseSettings):
    """Every knob batchserve reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="BATCHSERVE_", extra="ignore")

    database_url: str | None = None
    broker_url: str | None = None
    redis_url: str | None = None
    models: Path | None = Field(default=None, description="Path of the model registry file")

    # Prefix of every queue, Redis key and channel, so deployments and test runs can share servers.
    namespace: str = ""
    home: Path = Field(default=DEFAULT_HOME, description="Embedded database, model cache")
    env: Literal["development", "production"] = "development"
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"

    # Admission limits.
    max_body_bytes: int = 1_048_576
    max_input_chars: int = 200_000
    default_timeout_s: float = 600.0
    max_timeout_s: float = 7 * 86_400.0
    max_wait_s: float = 60.0
    idempotency_retention_s: float = 86_400.0

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

    webhook_allowlist: str = ""
    webhook_retry_schedule: str = "5,30,120,600,1800,7200,18000,36000,86400"

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
    def key_prefix(self) -> str:
        """Prefix of Redis keys (worker slots, rate limits)."""
        return self.namespace or "batchserve"

    def name(self, *parts: str) -> str:
        """A namespaced name for a queue, key or channel: ``ns.part.part``."""
        joined = ".".join(parts)
        return f"{self.namespace}.{joined}" if self.namespace else joined


def load_settings() -> Settings:
    return Settings()
