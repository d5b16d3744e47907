"""Where job completion callbacks may go: the operator's allow-list, and the addresses a host may
resolve to (:mod:`gateway.jobs.callback_sender` sends them, :mod:`gateway.jobs.callback_signature`
signs them).

**Where.** Only to origins the operator allow-lists (``GATEWAY_CALLBACK_ALLOW``: ``scheme://host[:port]``,
a host may be ``*.example.com`` for its subdomains). A URL's scheme, host and port must match an
entry exactly; user info (``user:pass@``) is refused. The host is then resolved, and every address it
resolves to must be a public one: private, loopback, link-local, shared (CGNAT), multicast, reserved
and unspecified addresses (IPv6 forms that embed an IPv4 address included: mapped, compatible, 6to4,
Teredo, NAT64) are refused unless the allow-list entry
names that IP literally or ``GATEWAY_CALLBACK_PRIVATE_NETWORKS`` holds it. This is checked when the
job is submitted (a 400 naming ``callback_url``) and again before every delivery, and the request
goes to the address that was checked (the name is not resolved a second time, so a DNS answer that
changes in between cannot redirect it), with the original ``Host`` and TLS server name.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.errors import CallbackRefused

__all__ = ["AllowedOrigin", "CallbackPolicy", "Target"]

DEFAULT_PORTS = {"http": 80, "https": 443}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]


def _ip(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


#: a host made of digits, dots and hex prefixes: what ``inet_aton`` (and so every resolver) reads as
#: an IPv4 address in decimal, octal or hex (``2130706433``, ``0177.1``, ``0x7f.1`` are 127.0.0.1)
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*$")


def _normal_host(host: str) -> str:
    """The host in one spelling; IPv4 in another notation and IPv6 zone ids are refused.

    Raises:
        ValueError: not a host name, or an address written so that checks and resolvers may disagree.
    """
    host = host.strip().rstrip(".").lower()
    if "%" in host:
        raise ValueError(f"an IPv6 zone id is not allowed in a callback host: {host!r}")
    address = _ip(host)
    if address is not None:
        return str(address)
    if _NUMERIC_HOST.match(host):
        raise ValueError(
            f"{host!r} is an IPv4 address in a non-standard notation; write it as a.b.c.d"
        )
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"not a host name: {host!r}") from exc


@dataclass(frozen=True)
class AllowedOrigin:
    """One allow-list entry: ``scheme://host[:port]``; ``*.example.com`` allows its subdomains."""

    scheme: str
    host: str
    port: int

    @classmethod
    def parse(cls, entry: str) -> AllowedOrigin:
        """Raises ``ValueError`` naming what is wrong with ``entry``."""
        parts = urlsplit(entry.strip())
        if parts.scheme not in DEFAULT_PORTS:
            raise ValueError(
                f"callback allow-list entry {entry!r}: the scheme must be http or https"
            )
        if (
            parts.username is not None
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                f"callback allow-list entry {entry!r}: only scheme://host[:port] (no path, no user)"
            )
        host = parts.hostname or ""
        wildcard = host.startswith("*.")
        if not host or "*" in host.removeprefix("*."):
            raise ValueError(
                f"callback allow-list entry {entry!r}: no host (a wildcard only as '*.domain')"
            )
        try:
            port = parts.port or DEFAULT_PORTS[parts.scheme]
        except ValueError as exc:
            raise ValueError(f"callback allow-list entry {entry!r}: bad port") from exc
        try:
            normal = _normal_host(host.removeprefix("*."))
        except ValueError as exc:
            raise ValueError(f"callback allow-list entry {entry!r}: {exc}") from exc
        return cls(parts.scheme, "*." + normal if wildcard else normal, port)

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if scheme != self.scheme or port != self.port:
            return False
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and len(host) > len(self.host) - 1
        return host == self.host


@dataclass(frozen=True)
class Target:
    """A callback URL that passed the allow-list: where to connect and what to ask for."""

    url: str
    scheme: str
    host: str
    port: int
    target: str  # path and query
    literal: IPAddress | None  # the host, when the allow-list names this IP itself

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


#: NAT64 prefixes (RFC 6052's well-known one and RFC 8215's local-use one): the IPv4 address is the
#: last 32 bits, and a NAT64 gateway forwards to it
_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address leads to: IPv4-mapped, IPv4-compatible, 6to4, Teredo, NAT64."""
    found: list[ipaddress.IPv4Address] = []
    if address.ipv4_mapped is not None:
        found.append(address.ipv4_mapped)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    packed = int(address)
    if any(address in network for network in _NAT64) or (packed >> 32 == 0 and packed > 1):
        found.append(
            ipaddress.IPv4Address(packed & 0xFFFFFFFF)
        )  # NAT64 or IPv4-compatible (::a.b.c.d)
    return found


def _refusal(address: IPAddress) -> str | None:
    """Why ``address`` may not be called back (``None``: a public address).

    An IPv6 address that embeds an IPv4 one (mapped, compatible, 6to4, Teredo, NAT64) is judged by
    the IPv4 address too: ``2002:7f00:1::`` reaches 127.0.0.1 through a 6to4 relay.
    """
    if isinstance(address, ipaddress.IPv6Address):
        for inner in _embedded_ipv4(address):
            reason = _refusal(inner)
            if reason is not None:
                return f"{reason} (as {inner})"
    for name in ("loopback", "unspecified", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{name}"):
            return f"a {name.replace('_', '-')} address"
    if not address.is_global:
        return "not a public address"
    return None


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class CallbackPolicy:
    """Which callback URLs are allowed (see the module docstring).

    Args:
        allow: allow-list entries (``scheme://host[:port]``); empty: callbacks are off.
        private_networks: CIDRs that hosts on the allow-list may resolve to although not public.
        max_url_chars: the longest URL.
        resolve_timeout_s: how long a name may take to resolve.
        resolver: ``(host, port) -> addresses`` (default: the system resolver); tests pass their own.
    """

    def __init__(
        self,
        allow: Sequence[str],
        private_networks: Sequence[str] = (),
        *,
        max_url_chars: int = 2048,
        resolve_timeout_s: float = 5.0,
        resolver: Resolver | None = None,
    ) -> None:
        self.allow = tuple(AllowedOrigin.parse(entry) for entry in allow)
        self.private_networks: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(cidr, strict=False) for cidr in private_networks
        )
        self.max_url_chars = max_url_chars
        self.resolve_timeout_s = resolve_timeout_s
        self._resolve = resolver or _getaddrinfo

    @property
    def enabled(self) -> bool:
        return bool(self.allow)

    def check_url(self, url: str) -> Target:
        """``url`` checked against the allow-list (no network access).

        Raises:
            CallbackRefused: callbacks are off, or the URL is malformed or not allow-listed.
        """
        if not self.enabled:
            raise CallbackRefused(
                "callbacks are not enabled on this gateway (GATEWAY_CALLBACK_ALLOW is empty)",
                field="callback_url",
            )
        if len(url) > self.max_url_chars:
            raise CallbackRefused(
                f"callback_url is {len(url)} characters; at most {self.max_url_chars}",
                field="callback_url",
            )
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
            host = _normal_host(parts.hostname or "")
        except ValueError as exc:
            raise CallbackRefused(
                f"callback_url is not a valid URL ({exc})", field="callback_url"
            ) from exc
        if parts.scheme not in DEFAULT_PORTS or not host:
            raise CallbackRefused(
                "callback_url must be an http or https URL with a host", field="callback_url"
            )
        if parts.username is not None or parts.password is not None:
            raise CallbackRefused(
                "callback_url must not carry credentials (user:password@)", field="callback_url"
            )
        if any(ord(c) < 33 or ord(c) == 127 for c in url):
            raise CallbackRefused(
                "callback_url must not contain spaces or control characters", field="callback_url"
            )
        entry = next((e for e in self.allow if e.matches(parts.scheme, host, port)), None)
        if entry is None:
            raise CallbackRefused(
                f"callback_url's origin {parts.scheme}://{host}:{port} is not on this gateway's "
                "callback allow-list",
                field="callback_url",
            )
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        literal = _ip(host) if entry.host == host else None
        return Target(url, parts.scheme, host, port, target, literal)

    async def addresses(self, target: Target) -> list[IPAddress]:
        """The addresses to call ``target`` at, every one allowed.

        Raises:
            CallbackRefused: the host does not resolve, or resolves to an address that is refused.
        """
        if target.literal is not None:
            return [target.literal]  # the operator named this address itself
        try:
            async with asyncio.timeout(self.resolve_timeout_s):
                found = await self._resolve(target.host, target.port)
        except (OSError, TimeoutError) as exc:
            raise CallbackRefused(
                f"callback_url's host {target.host!r} does not resolve", field="callback_url"
            ) from exc
        addresses = [a for a in (_ip(text.split("%", 1)[0]) for text in found) if a is not None]
        if not addresses:
            raise CallbackRefused(
                f"callback_url's host {target.host!r} does not resolve", field="callback_url"
            )
        for address in addresses:
            reason = _refusal(address)
            if reason is not None and not any(
                address in network for network in self.private_networks
            ):
                raise CallbackRefused(
                    f"callback_url's host {target.host!r} resolves to {address}, {reason}; such "
                    "addresses are refused unless the operator allow-lists them",
                    field="callback_url",
                )
        return addresses
