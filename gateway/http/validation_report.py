"""Request validation failures (pydantic's errors, as FastAPI raises them) as one clear error report:
the field at fault, 400 for a body that is not JSON or not Unicode text, 422 otherwise."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fastapi.exceptions import RequestValidationError

from gateway.http.problems import ErrorReport

__all__ = ["validation_report"]

_UNION_TAG = re.compile(r"^[\w-]+\[.*\]$|^(?:constrained-)?(?:str|bytes|int|float|bool|list|dict)$")


def _field_path(loc: Sequence[Any]) -> str:
    # pydantic names the union member an error came from in its location ("constrained-str",
    # "list[str]"); the client sent a field, not a type, so only the field path is named.
    parts = [
        str(part)
        for part in loc
        if part not in ("body", "query", "path", "header")
        and not (isinstance(part, str) and _UNION_TAG.search(part))
    ]
    return ".".join(parts)


def _most_specific(errors_: Sequence[Any]) -> dict[str, Any]:
    # Of the errors a union produced, the one about the value (too long, empty) beats "not this
    # type", and the deepest location (the list item) beats its container.
    def rank(error: dict[str, Any]) -> tuple[bool, int]:
        return (
            not str(error.get("type", "")).endswith("_type"),
            len(_field_path(error.get("loc", ()))),
        )

    return max(errors_, key=rank) if errors_ else {}


def validation_report(exc: RequestValidationError) -> ErrorReport:
    first = _most_specific(exc.errors())
    field = _field_path(first.get("loc", ())) or "body"
    if first.get("type") == "json_invalid":
        detail = f"body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
        return ErrorReport(400, "Bad request", detail, "bad_request", field="body")
    if first.get("type") == "string_unicode":
        # A lone surrogate escape ("\\ud800") is JSON but not Unicode text: no model can read it.
        detail = f"{field}: not valid Unicode text (a lone surrogate escape)"
        return ErrorReport(400, "Bad request", detail, "bad_request", field=field)
    detail = "; ".join(
        f"{_field_path(e.get('loc', ())) or 'body'}: {e.get('msg')}" for e in exc.errors()[:5]
    )
    return ErrorReport(422, "Validation error", detail, "validation_error", field=field)
