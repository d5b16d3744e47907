"""The parse pool (:class:`gateway.protocol.kserve.ParsePool`) with real worker processes: the same
request and the same errors as :func:`parse_rest` in process, and a 503 (then a fresh pool) when a
worker dies. The real gateway's use of it is in test_gateway_big_bodies.py."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest

from gateway.errors import BadRequest, ServiceUnavailable
from gateway.protocol.kserve import ParseLimits, ParsePool, _parse_pool, parse_rest

LIMITS = ParseLimits()
BODY = json.dumps(
    {
        "id": "big",
        "inputs": [
            {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[1, 2, 3], [4, 5, 6]]},
            {"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
        ],
        "outputs": [{"name": "y"}],
    }
).encode()


@pytest.fixture
async def pool():  # type: ignore[no-untyped-def]
    pool = ParsePool(1)
    pool.start()
    yield pool
    pool.close()


async def test_a_worker_parses_what_parse_rest_parses(pool: ParsePool) -> None:
    parsed = await pool.parse(BODY, None, LIMITS)
    expected = parse_rest(BODY, None, LIMITS)
    assert parsed.id == expected.id and parsed.outputs == expected.outputs
    for got, want in zip(parsed.inputs, expected.inputs, strict=True):
        assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
        assert isinstance(got.data, np.ndarray)
        assert got.data.dtype == want.data.dtype  # type: ignore[union-attr]
        np.testing.assert_array_equal(got.data, want.data)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body",
    [
        BODY + b"x",  # trailing garbage
        BODY.replace(b'"id": "big"', b'"id": "big", "id": "again"'),  # a duplicate key
        BODY.replace(b"[[1, 2, 3], [4, 5, 6]]", b"[[1, 2, 3], [4, 5]]"),  # a ragged tensor
        b"\xff" + BODY,  # not UTF-8
    ],
)
async def test_a_worker_raises_the_same_bad_request(pool: ParsePool, body: bytes) -> None:
    with pytest.raises(BadRequest) as in_process:
        parse_rest(body, None, LIMITS)
    with pytest.raises(BadRequest) as in_worker:
        await pool.parse(body, None, LIMITS)
    assert type(in_worker.value) is type(in_process.value)
    assert (in_worker.value.detail, in_worker.value.field) == (
        in_process.value.detail,
        in_process.value.field,
    )


async def test_the_spilled_body_is_removed_after_the_parse(pool: ParsePool) -> None:
    folder = Path(_parse_pool._SPILL_DIR or tempfile.gettempdir())
    before = set(folder.glob("gateway-body-*"))
    await pool.parse(BODY, None, LIMITS)
    with pytest.raises(BadRequest):
        await pool.parse(BODY + b"x", None, LIMITS)
    assert set(folder.glob("gateway-body-*")) <= before


async def test_a_dead_worker_is_a_503_and_the_pool_starts_again(pool: ParsePool) -> None:
    await pool.parse(BODY, None, LIMITS)  # the worker is running
    executor = pool._executor
    assert executor is not None
    for pid in list(executor._processes):  # what the kernel's OOM killer would do
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(ServiceUnavailable) as refused:
        await pool.parse(BODY, None, LIMITS)
    assert refused.value.headers["Retry-After"] == "1"
    assert (await pool.parse(BODY, None, LIMITS)).id == "big"  # a fresh pool serves again
