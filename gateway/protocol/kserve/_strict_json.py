"""Strict JSON: one reading of a body that every JSON parser agrees on, or a 400.

Parsers disagree on what is not plain RFC 8259 JSON, and the gateway must check exactly what
Triton will see. So a body is refused when it is not valid UTF-8, when an object repeats a key
(Python keeps the last, Triton's parser the first), when a string holds a lone surrogate escape
(``"\\ud800"``: no Unicode text, and parsers differ on it), or when it nests deeper than a small
bound. ``NaN`` and ``Infinity`` are not JSON and are refused too. Depth is measured by a linear scan
*before* any recursive parser runs, so a body of ``[[[[...`` a million levels deep costs one pass
over its bytes and never a deep recursion.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from gateway.errors import BadRequest

__all__ = ["has_surrogate", "loads", "nesting_depth"]

# A JSON string, escapes included (unrolled loop: linear, no backtracking).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
_SURROGATE = re.compile("[\ud800-\udfff]")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


class _NotJson(ValueError):
    pass


def _no_constants(name: str) -> float:
    raise _NotJson(f"{name} is not a JSON value")


class _LoneSurrogate(ValueError):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def nesting_depth(document: bytes) -> int:
    """How deeply ``document``'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _STRING.sub(b"", document).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = _STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max())


def has_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate (what ``"\\ud800"`` decodes to)."""
    return _SURROGATE.search(text) is not None


def _strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        if _SURROGATE.search(key):
            raise _LoneSurrogate(key)
        if isinstance(value, str) and _SURROGATE.search(value):
            raise _LoneSurrogate(value)
        result[key] = value
    return result


def loads(document: bytes, *, max_depth: int, what: str = "body") -> Any:
    """Parse ``document`` strictly.

    Strings directly inside objects (keys, names, ids, parameter values) are checked for lone
    surrogates here; strings inside arrays are the caller's to check where it keeps them (tensor
    data is converted to bytes, which fails on a surrogate and names the element).

    Args:
        document: the JSON bytes.
        max_depth: most levels of nested arrays/objects.
        what: how the message names the document (``"body"``, ``"JSON header"``).

    Returns:
        The parsed value (``dict``, ``list``, ...).

    Raises:
        BadRequest: invalid UTF-8, too deep, not JSON, a duplicate key or a lone surrogate
            (``field='body'``, or the key's name for a duplicate).
    """
    try:
        text = document.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{what} is not valid UTF-8 (byte {exc.start})", field="body") from None
    # Fast path: a body with few brackets cannot nest deeply; the scan is for the others.
    if (
        document.count(b"[") + document.count(b"{") > max_depth
        and (depth := nesting_depth(document)) > max_depth
    ):
        raise BadRequest(
            f"{what} nests {depth} levels deep; at most {max_depth} are allowed", field="body"
        )
    try:
        return json.loads(text, object_pairs_hook=_strict_object, parse_constant=_no_constants)
    except _DuplicateKey as exc:
        raise BadRequest(
            f"{what} repeats the key {exc.key!r} in one object", field=exc.key
        ) from None
    except _LoneSurrogate:
        raise BadRequest(
            f"{what} holds a lone UTF-16 surrogate escape (not Unicode text)", field="body"
        ) from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"{what} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            field="body",
        ) from None
    except _NotJson as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}", field="body") from None
    except ValueError:  # an integer literal longer than Python reads (4300 digits)
        raise BadRequest(f"{what} holds a number too long to read", field="body") from None
    except (
        RecursionError
    ):  # unreachable after the depth scan; kept so a scan bug can never be a 500
        raise BadRequest(f"{what} nests too deeply", field="body") from None
