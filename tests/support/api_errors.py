"""Reading the gateway's error answers in the shape each API defines (see ``gateway/http/problems.py``).

``/v2/*`` answers ``{"error": "..."}`` (KServe v2), ``/v1/models``, ``/v1/embeddings`` and
``/v1/images/*`` answer ``{"error": {"message", "type", "param", "code"}}`` (OpenAI), every other path
problem+json, as does any path when the request asked for it with ``Accept``. :func:`api_error`
checks that a response has exactly the shape its path calls for and returns what it says.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

__all__ = ["ApiError", "api_error", "expected_shape"]

_OPENAI_PREFIXES = ("/v1/models", "/v1/embeddings", "/v1/images")


@dataclass(frozen=True)
class ApiError:
    """An error answer, whatever its shape: the message, and the field at fault where the shape says."""

    shape: str
    message: str
    field: str | None
    code: str | None


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def expected_shape(path: str, accept: str = "") -> str:
    """``kserve``, ``openai`` or ``problem``: the error shape the gateway uses for ``path``."""
    if "application/problem+json" in accept:
        return "problem"
    if _under(path, "/v2"):
        return "kserve"
    if any(_under(path, prefix) for prefix in _OPENAI_PREFIXES):
        return "openai"
    return "problem"


def api_error(response: httpx.Response, status: int) -> ApiError:
    """Assert ``response`` is an error of ``status`` in its path's shape, and read it."""
    assert response.status_code == status, response.text
    shape = expected_shape(response.request.url.path, response.request.headers.get("accept", ""))
    content_type = response.headers["content-type"]
    body = response.json()
    if shape == "problem":
        assert content_type.startswith("application/problem+json"), content_type
        assert {"type", "title", "status", "detail", "instance"} <= set(body) and body[
            "status"
        ] == status
        return ApiError(
            shape, body["detail"], body.get("field"), str(body["type"]).rsplit(":", 1)[-1]
        )
    assert content_type.startswith("application/json"), content_type
    if shape == "kserve":
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
        return ApiError(shape, body["error"], None, None)
    error = body["error"]
    assert set(body) == {"error"} and set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    return ApiError(shape, error["message"], error["param"], error["code"])
