"""schemathesis hooks for the suite's run (``SCHEMATHESIS_HOOKS``).

A webhook URL's host must resolve to a public address, which the API checks (DNS included) and
no schema can state, and this machine resolves no name. In a request schemathesis generates as
valid (positive), a webhook URL is replaced by one at a public address literal before it is
sent, so a schema-valid request is one the server can accept; negative requests go as
generated, and must be refused.

Likewise an ``Idempotency-Key``: the same key with another body is refused (400/422), which no
schema can state either. A valid request's key is made its own (a fresh one) before it is sent.
"""

from __future__ import annotations

import uuid
from typing import Any

import schemathesis
from schemathesis.generation import GenerationMode

PUBLIC_URL = "https://93.184.215.14/hook"
URL_FIELDS = ("webhook_url", "url")


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = case.meta
    if meta is None or meta.generation.mode != GenerationMode.POSITIVE:
        return case
    if case.headers and "Idempotency-Key" in case.headers:
        case.headers = {**case.headers, "Idempotency-Key": uuid.uuid4().hex}
    if isinstance(case.body, dict):
        for field in URL_FIELDS:
            if isinstance(case.body.get(field), str):
                case.body = {**case.body, field: PUBLIC_URL}
    return case
