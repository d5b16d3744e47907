"""Job completion callbacks: where they may go, how they are signed, how they are sent.

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

**How.** ``POST`` with a JSON body, no proxies from the environment, no redirects followed (a 3xx
is a failed delivery), a total timeout of ``GATEWAY_CALLBACK_TIMEOUT_S``, and the response body is
never read. 2xx is delivered; 408, 425, 429, 5xx, timeouts and connection errors are retried with
exponential backoff (``GATEWAY_CALLBACK_BACKOFF_S`` doubling, at most 5 minutes apart) up to
``GATEWAY_CALLBACK_MAX_ATTEMPTS`` attempts; any other answer ends the delivery as failed.

**Signature** (as Stripe's and GitHub's webhooks do it), header ``Gateway-Signature``::

    Gateway-Signature: t=1767225600,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd

``v1`` is the lowercase hex HMAC-SHA256, keyed with ``GATEWAY_CALLBACK_SECRET``, of the timestamp,
a period and the raw body: ``f"{t}.".encode() + body``. A receiver recomputes it over the bytes it
received, compares in constant time and refuses timestamps older than a few minutes (replays);
:func:`verify` does exactly that. ``Gateway-Job-Id`` names the job: a callback can arrive more than
once (a delivery whose answer was lost is retried), so receivers should act on a job id once.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import re
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.errors import CallbackRefused

__all__ = [
    "JOB_ID_HEADER",
    "SIGNATURE_HEADER",
    "AllowedOrigin",
    "CallbackPolicy",
    "CallbackSender",
    "Delivery",
    "Target",
    "sign",
    "verify",
]

SIGNATURE_HEADER = "Gateway-Signature"
JOB_ID_HEADER = "Gateway-Job-Id"
DEFAULT_PORTS = {"http": 80, "https": 443}
#: the longest wait between two attempts
MAX_BACKOFF_S = 300.0
#: answers worth another attempt; any other non-2xx ends the delivery
RETRY_STATUSES = frozenset({408, 425, 429})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[str]]]


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The ``Gateway-Signature`` header value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(
    secret: bytes, header: str, body: bytes, *, tolerance_s: float = 300, now: float | None = None
) -> bool:
    """Whether ``header`` (a ``Gateway-Signature`` value) signs ``body`` with ``secret``, recently.

    What a receiver runs on the raw body it received, before parsing it.
    """
    parts = dict(item.split("=", 1) for item in header.split(",") if "=" in item)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        return False
    expected = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    # Bytes: compare_digest raises on a str holding anything but ASCII, and a header can hold other bytes.
    return hmac.compare_digest(
        expected.encode(), parts.get("v1", "").encode("utf-8", "surrogateescape")
    )


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
                f"callback_url's origin {parts.scheme}://{host}:{port} is not on this gateway's callback allow-list",
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
                    f"callback_url's host {target.host!r} resolves to {address}, {reason}; such addresses are "
                    "refused unless the operator allow-lists them",
                    field="callback_url",
                )
        return addresses


@dataclass(frozen=True)
class Delivery:
    """One attempt's result: ``delivered``, else whether another attempt may help, and why it failed."""

    delivered: bool
    retry: bool = False
    error: str = ""


class CallbackSender:
    """Signs and sends callbacks under a :class:`CallbackPolicy`.

    Args:
        policy: where callbacks may go.
        secret: the HMAC key (``GATEWAY_CALLBACK_SECRET``).
        timeout_s: the whole attempt, from resolving to the response's status line.
        clock: wall-clock seconds, for the signature's timestamp.
    """

    def __init__(
        self,
        policy: CallbackPolicy,
        secret: bytes,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self._secret = secret
        self.timeout_s = timeout_s
        self._clock = clock
        # No proxies from the environment (they would connect to the name, not the checked address),
        # no redirects, and no kept-alive connections: a pooled connection is keyed by the address, and
        # one made (and verified) for one host name must not carry another's callback.
        self._client = httpx.AsyncClient(
            trust_env=False,
            follow_redirects=False,
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    def body(self, event: dict[str, Any]) -> bytes:
        return json.dumps(event, separators=(",", ":")).encode()

    async def send(self, url: str, body: bytes, job_id: str) -> Delivery:
        """One signed ``POST`` of ``body`` to ``url`` (checked again first)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                target = self.policy.check_url(url)
                address = (await self.policy.addresses(target))[0]
                host = f"[{address}]" if address.version == 6 else str(address)
                headers = {
                    "Host": target.host_header,
                    "Content-Type": "application/json",
                    "User-Agent": "triton-platform-gateway-callbacks/1",
                    SIGNATURE_HEADER: sign(self._secret, body, int(self._clock())),
                    JOB_ID_HEADER: job_id,
                }
                extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
                request = self._client.build_request(
                    "POST",
                    f"{target.scheme}://{host}:{target.port}{target.target}",
                    content=body,
                    headers=headers,
                    extensions=extensions,
                )
                response = await self._client.send(request, stream=True)
                await response.aclose()  # the receiver's body is never read
        except CallbackRefused as exc:
            return Delivery(False, retry=False, error=exc.detail)
        except TimeoutError:
            return Delivery(False, retry=True, error=f"no answer within {self.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return Delivery(
                False, retry=True, error=f"{type(exc).__name__}: could not reach the receiver"
            )
        status = response.status_code
        if 200 <= status < 300:
            return Delivery(True)
        if 300 <= status < 400:
            return Delivery(False, retry=False, error=f"HTTP {status}: redirects are not followed")
        return Delivery(
            False, retry=status in RETRY_STATUSES or status >= 500, error=f"HTTP {status}"
        )

    def backoff_s(self, attempts: int, base_s: float) -> float:
        """The wait before attempt ``attempts + 1``: ``base_s`` doubling, at most :data:`MAX_BACKOFF_S`."""
        return float(min(MAX_BACKOFF_S, base_s * 2 ** max(0, attempts - 1)))

    async def close(self) -> None:
        await self._client.aclose()
