"""The SSRF guard: a webhook URL may only reach public addresses.

batchserve calls URLs its users give it, from inside its own network, so a URL that names
``169.254.169.254`` (cloud metadata), ``localhost`` or a private address would make it a proxy
into places its users must not reach. Refused: schemes other than http and https, URLs with
userinfo, and hosts that resolve to a loopback, private (RFC 1918, ``fc00::/7``), link-local,
shared (CGNAT ``100.64.0.0/10``), multicast, unspecified, broadcast, reserved or otherwise
non-global address, also when an IPv4 address hides inside an IPv6 one (mapped, 6to4, NAT64).

The check runs at submission (quick feedback) and again at delivery time against the addresses
the name resolves to *then*; the sender connects to the very address it checked, so a name that
resolves to a public address once and a private one next (DNS rebinding) gains nothing.
``BATCHSERVE_WEBHOOK_ALLOWLIST`` (host names or CIDRs) exempts hosts, for development and tests.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from batchserve.core.errors import BatchserveError, UnsafeWebhookUrl

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

CGNAT = ipaddress.ip_network("100.64.0.0/10")
BROADCAST = ipaddress.ip_address("255.255.255.255")
# NAT64 prefixes (RFC 6052, RFC 8215): the last 32 bits are the IPv4 address reached.
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
DEFAULT_PORTS = {"http": 80, "https": 443}
# The form of a webhook URL, as the API's document states it and parse_webhook_url enforces
# it: http(s), printable ASCII only (RFC 3986: other characters are percent-encoded), no
# userinfo. The host's own checks (a DNS name or an IP literal, a public address) follow.
WEBHOOK_URL_PATTERN = r'^[Hh][Tt][Tt][Pp][Ss]?://[!"$-.0->A-~]+([/?#][!-~]*)?$'
_WEBHOOK_URL = re.compile(WEBHOOK_URL_PATTERN)
MAX_HOST_CHARS = 253
MAX_LABEL_CHARS = 63


class ResolutionFailed(BatchserveError):
    """The host name did not resolve (for now: a delivery retries)."""

    code = "dns_failure"


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """A parsed webhook URL: ``host`` is a lowercase name or an IP literal (no brackets)."""

    url: str
    scheme: str
    host: str
    port: int

    @property
    def address(self) -> IPAddress | None:
        """The host as an IP address when the URL names one, else ``None``."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse_webhook_url(url: str, field: str = "webhook_url") -> WebhookTarget:
    """Split a webhook URL, refusing anything but plain ``http(s)://host[:port]/...``; a
    refusal names ``field`` (the body field the URL came in)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UnsafeWebhookUrl(f"{field} is not a valid URL: {error}", field) from error
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise UnsafeWebhookUrl(f"{field} must be an absolute http(s) URL", field)
    if "@" in parts.netloc:
        raise UnsafeWebhookUrl(f"{field} must not carry a user name or password", field)
    if not _WEBHOOK_URL.match(url):
        raise UnsafeWebhookUrl(
            f"{field} must be printable ASCII with no spaces (percent-encode other characters)",
            field,
        )
    host = parts.hostname.lower().rstrip(".")
    _check_host(host, field)
    return WebhookTarget(url=url, scheme=scheme, host=host, port=port or DEFAULT_PORTS[scheme])


def _check_host(host: str, field: str) -> None:
    """An IP literal, or a name of DNS labels of 1 to 63 characters, 253 in all (a longer one
    cannot be looked up: the resolver's IDNA encoding raised, a 500)."""
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    labels = host.split(".")
    if len(host) > MAX_HOST_CHARS or not all(0 < len(lb) <= MAX_LABEL_CHARS for lb in labels):
        raise UnsafeWebhookUrl(
            f"{field} host is not a DNS name: labels of 1 to {MAX_LABEL_CHARS} characters, "
            f"{MAX_HOST_CHARS} in all",
            field,
        )


def forbidden_reason(address: IPAddress) -> str | None:
    """Why a webhook may not be sent to ``address``; ``None`` when it is a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(address)
        if embedded is not None:
            reason = forbidden_reason(embedded)
            return f"{reason} (IPv4 inside IPv6)" if reason else None
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if isinstance(address, ipaddress.IPv4Address):
        if address in CGNAT:
            return "shared address space (CGNAT)"
        if address == BROADCAST:
            return "broadcast"
    if address.is_multicast:
        return "multicast"
    if address.is_private:
        return "private"
    if address.is_reserved:
        return "reserved"
    if not address.is_global:
        return "not globally routable"
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in net for net in NAT64):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


@dataclass(frozen=True, slots=True)
class Allowlist:
    """Hosts (exact names) and networks the guard lets through: development and tests only."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Allowlist:
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            except ValueError:
                hosts.add(item.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows_host(self, host: str) -> bool:
        return host in self.hosts

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to, through the event loop (never blocking it)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: dict[IPAddress, None] = {}
    for _family, _type, _proto, _canon, sockaddr in infos:
        # IPv6 scope ids ("fe80::1%eth0") are dropped: the address alone is what is checked.
        seen.setdefault(ipaddress.ip_address(str(sockaddr[0]).split("%")[0]), None)
    return list(seen)


class UrlGuard:
    """Decides whether a webhook URL may be called, and which address to connect to."""

    def __init__(
        self,
        allowlist: Allowlist | None = None,
        *,
        resolve_timeout_s: float = 2.0,
        resolver: Resolver = system_resolver,
    ) -> None:
        self.allowlist = allowlist or Allowlist()
        self.resolve_timeout_s = resolve_timeout_s
        self._resolver = resolver

    async def check_submission(self, url: str, field: str = "webhook_url") -> None:
        """Refuse (``UnsafeWebhookUrl``, naming ``field``) a URL that is malformed or reaches a
        private address.

        A name that does not exist is refused too; one whose lookup merely times out or fails
        for now is let through, since the delivery-time check decides for good.
        """
        target = parse_webhook_url(url, field)
        try:
            await self.resolve(target, field)
        except ResolutionFailed as error:
            if error.details.get("permanent"):
                message = f"{field} host {target.host!r} does not resolve"
                raise UnsafeWebhookUrl(message, field) from error

    async def resolve(self, target: WebhookTarget, field: str = "webhook_url") -> IPAddress:
        """The checked address to connect to for ``target``.

        Every address the name resolves to must pass, not only the one picked: a resolver that
        mixes a public and a private answer is refused outright.
        """
        literal = target.address
        if literal is not None:
            addresses = [literal]
        else:
            addresses = await self._lookup(target)
        if self.allowlist.allows_host(target.host):
            return addresses[0]
        for address in addresses:
            if self.allowlist.allows_address(address):
                continue
            reason = forbidden_reason(address)
            if reason is not None:
                shown = target.host if literal else f"{target.host} resolves to {address}"
                raise UnsafeWebhookUrl(f"{field} may not reach {shown}: a {reason} address", field)
        return addresses[0]

    async def _lookup(self, target: WebhookTarget) -> list[IPAddress]:
        try:
            async with asyncio.timeout(self.resolve_timeout_s):
                addresses = await self._resolver(target.host, target.port)
        except TimeoutError as error:
            raise ResolutionFailed(f"resolving {target.host} timed out") from error
        except socket.gaierror as error:
            permanent = error.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5))
            raise ResolutionFailed(
                f"{target.host} does not resolve: {error.strerror}", permanent=permanent
            ) from error
        except UnicodeError as error:  # a name the IDNA codec cannot encode: never resolves
            raise ResolutionFailed(
                f"{target.host} is not a name that can resolve: {error}", permanent=True
            ) from error
        except OSError as error:
            raise ResolutionFailed(f"resolving {target.host} failed: {error}") from error
        if not addresses:
            raise ResolutionFailed(f"{target.host} has no address", permanent=True)
        return addresses
