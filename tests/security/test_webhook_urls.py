"""``/v1/webhooks/endpoints/enable`` checks its URL as a request's ``webhook_url`` is checked
(issue 21, item 6): loopback, private and malformed URLs are refused, naming ``url``."""

from __future__ import annotations

import httpx
import pytest

ENABLE = "/v1/webhooks/endpoints/enable"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/hook",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://10.0.0.7/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://2130706433/hook",  # 127.0.0.1 as a decimal integer
        "http://0x7f.0.0.1/hook",
        "http://0177.0.0.1/hook",  # octal
        "http://0x7f000001/hook",  # one hex integer
        "http://[::ffff:127.0.0.1]/hook",
        "http://example.com/a\x00b",
        "ftp://example.com/hook",
        "http://user:pass@example.com/hook",
        # A label past 63 characters: the resolver's IDNA encoding raised, a 500 (schemathesis).
        "https://" + "0" * 300 + "/hook",
        "http://ex\u00e4mple.com/hook",  # not ASCII: percent-encode (RFC 3986)
    ],
)
async def test_enable_refuses_what_a_webhook_url_may_not_be(
    client: httpx.AsyncClient, url: str
) -> None:
    response = await client.post(ENABLE, json={"url": url})
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "unsafe_webhook_url" and problem["field"] == "url", problem
    # The same URL as a request's webhook is refused the same way.
    submitted = await client.post(
        "/v1/requests", json={"model": "echo-100ms", "input": "x", "webhook_url": url}
    )
    assert submitted.status_code == 422 and submitted.json()["field"] == "webhook_url"


async def test_enable_takes_a_public_address(client: httpx.AsyncClient) -> None:
    response = await client.post(ENABLE, json={"url": "https://93.184.215.14/hook"})
    assert response.status_code == 200, response.text
    assert response.json()["url"] == "https://93.184.215.14/hook"
    assert response.json()["enabled"] is True
