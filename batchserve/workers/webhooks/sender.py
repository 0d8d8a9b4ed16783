"""One HTTP attempt at a webhook URL, through the SSRF guard, pinned to the address it checked.

The name is resolved once, every address is checked, and the request goes to the checked IP
with the ``Host`` header and TLS SNI (and certificate check) of the name, so a second DNS
answer can never steer the connection somewhere else. Connections are never reused: a pooled
connection is keyed by IP, and two names sharing one must not share a TLS session. Redirects are
not followed, proxies from the environment are not used, and the whole attempt (resolution
included) has one deadline.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import httpx

from batchserve.core.errors import UnsafeWebhookUrl
from batchserve.core.ssrf import ResolutionFailed, UrlGuard, WebhookTarget, parse_webhook_url
from batchserve.core.webhook_policy import AttemptOutcome, parse_retry_after

MAX_SNIPPET_BYTES = 512


class WebhookSender:
    """Posts signed bodies to webhook URLs; never raises for what a receiver does."""

    def __init__(
        self,
        guard: UrlGuard,
        *,
        timeout_s: float,
        max_connections: int = 64,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.guard = guard
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            verify=verify,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=0),
        )

    async def send(self, url: str, headers: dict[str, str], body: bytes) -> AttemptOutcome:
        started = time.monotonic()
        address: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                target = parse_webhook_url(url)
                ip = await self.guard.resolve(target)
                address = str(ip)
                return await self._post(target, address, headers, body, started)
        except UnsafeWebhookUrl as error:
            return _failed(started, f"refused: {error.message}", address, permanent=True)
        except ResolutionFailed as error:
            return _failed(started, f"dns: {error.message}", address)
        except (TimeoutError, httpx.TimeoutException):
            return _failed(started, f"timed out after {self.timeout_s:g} s", address)
        except httpx.HTTPError as error:
            return _failed(started, f"connection error: {type(error).__name__}: {error}", address)
        except OSError as error:
            return _failed(started, f"connection error: {error}", address)

    async def _post(
        self,
        target: WebhookTarget,
        address: str,
        headers: dict[str, str],
        body: bytes,
        started: float,
    ) -> AttemptOutcome:
        original = httpx.URL(target.url)
        pinned = original.copy_with(host=address)
        extensions = {}
        if target.scheme == "https" and target.address is None:
            extensions["sni_hostname"] = target.host
        request_headers = {**headers, "host": original.netloc.decode("ascii")}
        async with self._client.stream(
            "POST", pinned, content=body, headers=request_headers, extensions=extensions
        ) as response:
            snippet = await _read_snippet(response)
        code = response.status_code
        retry_after = parse_retry_after(response.headers.get("retry-after"), time.time())
        error = None
        if not 200 <= code < 300:
            error = f"HTTP {code}"
            if 300 <= code < 400:
                error += f": redirect to {response.headers.get('location', '?')} not followed"
            elif snippet:
                error += f": {snippet}"
        return AttemptOutcome(
            status_code=code,
            error=error,
            retry_after_s=retry_after,
            duration_ms=(time.monotonic() - started) * 1000.0,
            address=address,
        )

    async def close(self) -> None:
        await self._client.aclose()


async def _read_snippet(response: httpx.Response) -> str:
    """The start of the receiver's answer, for the attempt log; the rest is not downloaded."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_SNIPPET_BYTES:
            break
    text = b"".join(chunks)[:MAX_SNIPPET_BYTES].decode("utf-8", errors="replace")
    return " ".join(text.split())


def _failed(
    started: float, error: str, address: str | None, *, permanent: bool = False
) -> AttemptOutcome:
    return AttemptOutcome(
        error=error,
        duration_ms=(time.monotonic() - started) * 1000.0,
        address=address,
        permanent=permanent,
    )
