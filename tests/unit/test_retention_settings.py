"""The retention of finished requests: a setting that may not undercut idempotency."""

from __future__ import annotations

import pytest

from batchserve.core.settings import Settings


def test_requests_are_kept_at_least_as_long_as_idempotency_keys() -> None:
    assert Settings().request_retention_s == 30 * 86_400.0
    Settings(request_retention_s=3_600.0, idempotency_retention_s=3_600.0)
    with pytest.raises(ValueError, match="BATCHSERVE_REQUEST_RETENTION_S must be at least"):
        Settings(request_retention_s=3_600.0, idempotency_retention_s=7_200.0)
    with pytest.raises(ValueError, match="request_retention_s"):
        Settings(request_retention_s=0)
