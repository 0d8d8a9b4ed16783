"""The SSRF guard: which URLs and addresses a webhook may reach, at submission and at delivery
time, with a stubbed resolver."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from batchserve.core.errors import UnsafeWebhookUrl
from batchserve.core.ssrf import (
    Allowlist,
    IPAddress,
    ResolutionFailed,
    UrlGuard,
    forbidden_reason,
    parse_webhook_url,
)


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.1", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fc00::1", "private"),
        ("fd12:3456::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "shared address space (CGNAT)"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "private"),
        ("::ffff:127.0.0.1", "loopback (IPv4 inside IPv6)"),
        ("::ffff:169.254.169.254", "link-local (IPv4 inside IPv6)"),
        ("64:ff9b::a00:1", "private (IPv4 inside IPv6)"),
        ("2002:a00:1::", "private (IPv4 inside IPv6)"),
        ("2001:db8::1", "private"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
    ],
)
def test_address_classification(address: str, reason: str | None) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "https://user:pw@example.com/hook",
        "https://user@example.com/hook",
        "http:///nohost",
        "https://example.com:99999/",
        "https://exa mple.com/",
    ],
)
def test_malformed_or_credentialed_urls_are_refused(url: str) -> None:
    with pytest.raises(UnsafeWebhookUrl) as refused:
        parse_webhook_url(url)
    assert refused.value.field == "webhook_url"


def stub(table: dict[str, list[str]]) -> object:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [ipaddress.ip_address(a) for a in table[host]]

    return resolve


async def test_a_name_resolving_to_a_forbidden_address_is_refused_at_delivery() -> None:
    guard = UrlGuard(
        resolver=stub(  # type: ignore[arg-type]
            {
                "public.test": ["93.184.216.34"],
                "rebound.test": ["10.1.2.3"],
                "mixed.test": ["93.184.216.34", "127.0.0.1"],
                "metadata.test": ["::ffff:169.254.169.254"],
            }
        )
    )
    target = parse_webhook_url("https://public.test/hook")
    assert str(await guard.resolve(target)) == "93.184.216.34"
    for host in ("rebound.test", "mixed.test", "metadata.test"):
        with pytest.raises(UnsafeWebhookUrl, match=host):
            await guard.resolve(parse_webhook_url(f"https://{host}/hook"))
    with pytest.raises(ResolutionFailed):
        await guard.resolve(parse_webhook_url("https://nowhere.test/hook"))


async def test_allowlist_exempts_named_hosts_and_networks() -> None:
    resolver = stub({"dev.local": ["127.0.0.1"], "other.local": ["10.0.0.9"]})
    guard = UrlGuard(Allowlist.parse("dev.local, 10.0.0.0/8"), resolver=resolver)  # type: ignore[arg-type]
    assert str(await guard.resolve(parse_webhook_url("http://dev.local/h"))) == "127.0.0.1"
    assert str(await guard.resolve(parse_webhook_url("http://other.local/h"))) == "10.0.0.9"
    assert str(await guard.resolve(parse_webhook_url("http://10.9.9.9/h"))) == "10.9.9.9"
    with pytest.raises(UnsafeWebhookUrl):
        await guard.resolve(parse_webhook_url("http://127.0.0.1/h"))


async def test_submission_refuses_unknown_names_but_not_slow_lookups() -> None:
    async def slow(host: str, port: int) -> list[IPAddress]:
        import asyncio

        await asyncio.sleep(10)
        return []

    guard = UrlGuard(resolver=stub({}))  # type: ignore[arg-type]
    with pytest.raises(UnsafeWebhookUrl, match="does not resolve"):
        await guard.check_submission("https://nowhere.test/hook")
    # A lookup that times out is not the caller's fault: the delivery-time check decides.
    await UrlGuard(resolver=slow, resolve_timeout_s=0.05).check_submission("https://slow.test/")
