"""How job completion callbacks are sent: one signed ``POST`` to an address the policy checked.

**How.** ``POST`` with a JSON body, no proxies from the environment, no redirects followed (a 3xx
is a failed delivery), a total timeout of ``GATEWAY_CALLBACK_TIMEOUT_S``, and the response body is
never read. 2xx is delivered; 408, 425, 429, 5xx, timeouts and connection errors are retried with
exponential backoff (``GATEWAY_CALLBACK_BACKOFF_S`` doubling, at most 5 minutes apart) up to
``GATEWAY_CALLBACK_MAX_ATTEMPTS`` attempts; any other answer ends the delivery as failed.

Where they may go is :mod:`gateway.jobs.callback_policy`; how they are signed (and how a receiver
checks them) is :mod:`gateway.jobs.callback_signature`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.errors import CallbackRefused
from gateway.jobs.callback_policy import CallbackPolicy
from gateway.jobs.callback_signature import JOB_ID_HEADER, SIGNATURE_HEADER, sign

__all__ = ["CallbackSender", "Delivery"]

#: the longest wait between two attempts
MAX_BACKOFF_S = 300.0
#: answers worth another attempt; any other non-2xx ends the delivery
RETRY_STATUSES = frozenset({408, 425, 429})


@dataclass(frozen=True)
class Delivery:
    """One attempt's result: ``delivered``, else whether another attempt may help, and why it failed."""

    delivered: bool
    retry: bool = False
    error: str = ""


# eq=False: one object with its own state, compared (and hashed) by identity.
@dataclass(eq=False)
class CallbackSender:
    """Signs and sends callbacks under a :class:`CallbackPolicy`.

    Args:
        policy: where callbacks may go.
        secret: the HMAC key (``GATEWAY_CALLBACK_SECRET``).
        timeout_s: the whole attempt, from resolving to the response's status line.
        clock: wall-clock seconds, for the signature's timestamp.
    """

    policy: CallbackPolicy
    secret: bytes = field(repr=False)  # the signing key never shows in a repr or a log line
    timeout_s: float
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        # No proxies from the environment (they would connect to the name, not the checked address),
        # no redirects, and no kept-alive connections: a pooled connection is keyed by the address, and
        # one made (and verified) for one host name must not carry another's callback.
        self._client = httpx.AsyncClient(
            trust_env=False,
            follow_redirects=False,
            timeout=self.timeout_s,
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
                    SIGNATURE_HEADER: sign(self.secret, body, int(self.clock())),
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
