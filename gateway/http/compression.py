"""Compressed request bodies: decoded here, under the same byte cap as plain ones, or refused.

Triton decompresses ``Content-Encoding: gzip``/``deflate`` bodies itself, so a body checked in its
compressed form is not the body Triton reads (a 1 MB gzip request once grew Triton to 2.1 GB).
The gateway therefore never forwards a compressed body: :class:`DecompressionMiddleware` decodes it
while it streams in, stops the moment the decoded size passes ``max_body_bytes`` (a decompression
bomb costs at most that much memory), and hands the app a plain body with the
``content-encoding`` header removed. Any other coding is answered with 415.
"""

from __future__ import annotations

import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from gateway.http.problems import ProblemRenderer

__all__ = ["SUPPORTED_ENCODINGS", "BoundedDecoder", "DecompressionMiddleware"]


#: Content-Encoding values the gateway decodes (``identity`` is a plain body)
SUPPORTED_ENCODINGS = ("gzip", "deflate", "identity")
# Output is produced in slices this large, so one call never builds much more than this at once.
_SLICE = 1 << 20
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class BoundedDecoder:
    """Incremental gzip/deflate (zlib) decoder that refuses to produce more than ``max_bytes``.

    Args:
        encoding: ``gzip`` or ``deflate``.
        max_bytes: the most decoded bytes allowed.
    """

    def __init__(self, encoding: str, max_bytes: int) -> None:
        self.encoding = encoding
        self.max_bytes = max_bytes
        self.produced = 0
        self._fed = False
        self._zlib = zlib.decompressobj(_WBITS[encoding])

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"request body decompresses to more than the limit of {self.max_bytes} bytes",
            field="body",
        )

    def feed(self, chunk: bytes) -> bytes:
        """Decode the next compressed chunk.

        Raises:
            PayloadTooLarge: the decoded body passed ``max_bytes``.
            BadRequest: the data is not valid for the encoding, or continues after its end.
        """
        out: list[bytes] = []
        data = chunk
        self._fed = self._fed or bool(chunk)
        try:
            while data:
                if self._zlib.eof:
                    raise BadRequest(
                        f"request body continues after the end of its {self.encoding} data",
                        field="body",
                    )
                room = self.max_bytes - self.produced
                piece = self._zlib.decompress(data, min(_SLICE, room + 1))
                self.produced += len(piece)
                if self.produced > self.max_bytes:
                    raise self._too_large()
                out.append(piece)
                data = self._zlib.unconsumed_tail or self._zlib.unused_data
        except zlib.error:
            raise BadRequest(
                f"request body is not valid {self.encoding} data", field="body"
            ) from None
        return b"".join(out)

    def finish(self) -> bytes:
        """Flush the decoder at the end of the body.

        An empty body stays empty (a client may label a bodiless request as compressed).

        Raises:
            BadRequest: the compressed data was cut short.
            PayloadTooLarge: the last bytes passed ``max_bytes``.
        """
        if not self._fed:
            return b""
        try:
            tail = self._zlib.flush()
        except zlib.error:
            raise BadRequest(
                f"request body is not valid {self.encoding} data", field="body"
            ) from None
        self.produced += len(tail)
        if self.produced > self.max_bytes:
            raise self._too_large()
        if not self._zlib.eof:
            raise BadRequest(
                f"request body ends before its {self.encoding} data does", field="body"
            )
        return tail


def _content_encoding(scope: Scope) -> str | None:
    values = [
        v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == b"content-encoding"
    ]
    if not values:
        return None
    return ",".join(values).strip().lower()


class DecompressionMiddleware:
    """Decodes ``Content-Encoding: gzip``/``deflate`` request bodies as they arrive; 415 for others.

    Sits inside the body-size and authentication middleware, so the compressed bytes are capped
    there, nothing is decoded for an unauthenticated caller, and the decoded bytes are capped here.

    Args:
        app: the next ASGI app.
        max_bytes: the most decoded bytes (the same cap as plain bodies).
        renderer: the problem renderer.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, renderer: ProblemRenderer) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.renderer = renderer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoding = _content_encoding(scope) if scope["type"] == "http" else None
        if encoding is None or encoding == "identity":
            await self.app(scope, receive, send)
            return
        if encoding not in _WBITS:
            await self.renderer.answer(
                scope,
                send,
                UnsupportedMediaType(
                    f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or an "
                    "uncompressed body",
                    field="Content-Encoding",
                ),
            )
            return
        decoder = BoundedDecoder(encoding, self.max_bytes)
        failure: BadRequest | PayloadTooLarge | None = None
        started = False
        scope = dict(scope)
        scope["headers"] = [
            (k, v)
            for k, v in scope.get("headers", [])
            if k.lower() not in (b"content-encoding", b"content-length")
        ]

        async def decoded_receive() -> Message:
            nonlocal failure
            message = await receive()
            if message["type"] != "http.request":
                return message
            try:
                body = decoder.feed(message.get("body", b""))
                if not message.get("more_body", False):
                    body += decoder.finish()
            except (BadRequest, PayloadTooLarge) as exc:
                failure = exc
                raise
            return {
                "type": "http.request",
                "body": body,
                "more_body": message.get("more_body", False),
            }

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if failure is not None:
                return  # the app's own answer to the failed read is replaced by ours
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, decoded_receive, guarded_send)
        except (BadRequest, PayloadTooLarge):
            if started or failure is None:
                raise
        if failure is not None and not started:
            await self.renderer.answer(scope, send, failure)
