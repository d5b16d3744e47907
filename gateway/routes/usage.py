"""Usage metering: ``GET /v1/usage`` (the caller's own) and ``GET /admin/usage`` (any client), JSON or CSV."""

from __future__ import annotations

import csv
import datetime as dt
import io
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, Field

from gateway.errors import BadRequest, ServiceUnavailable
from gateway.protocol.rest import problem_responses
from gateway.tenancy.context import RequestContext
from gateway.tenancy.usage import UsageMeter, UsageRow, UsageStoreError

from ._deps import app_state, get_context

router = APIRouter(tags=["usage"])

MAX_DAYS = 366
_DEFAULT_DAYS = 31
_CSV_COLUMNS = (
    "day",
    "client",
    "model",
    "requests",
    "failed",
    "images",
    "inputs",
    "tokens",
    "compute_ms",
)


class UsageEntry(BaseModel):
    """One client's usage of one model on one UTC day."""

    day: str = Field(description="UTC day, YYYY-MM-DD")
    client: str = Field(description="the client's public id: key:<key_id> or jwt:<subject>")
    model: str
    requests: int = Field(description="admitted requests answered successfully")
    failed: int = Field(description="admitted requests that ended in an error")
    images: int = Field(description="images classified or generated")
    inputs: int = Field(description="texts embedded")
    tokens: int = Field(
        description="tokens of the embedded texts, counted by the model's tokenizer"
    )
    compute_ms: float = Field(description="time the gateway waited on Triton for these requests")


class UsageReport(BaseModel):
    start: dt.date
    end: dt.date
    client: str | None = Field(description="whose usage; null: every client (admin)")
    data: list[UsageEntry]
    totals: dict[str, float] = Field(description="sums over data")


# one row's counts, so they are the totals too
_EXAMPLE_COUNTS = {
    "requests": 120,
    "failed": 1,
    "images": 0,
    "inputs": 480,
    "tokens": 9120,
    "compute_ms": 5130.2,
}
_EXAMPLE = {
    "start": "2026-12-01",
    "end": "2026-12-02",
    "client": "key:3f9a0c1b2d4e",
    "data": [
        {
            "day": "2026-12-02",
            "client": "key:3f9a0c1b2d4e",
            "model": "text_embedding",
            **_EXAMPLE_COUNTS,
        }
    ],
    "totals": _EXAMPLE_COUNTS,
}
_DESCRIPTION = (
    "Counts per client, model and UTC day, for every request admitted past scope and rate limits "
    "(every tier, unlimited ones included): `requests` answered successfully, `failed` ones, `images` "
    "classified or generated, `inputs` (texts) embedded, `tokens` of those texts as the model's tokenizer "
    "counts them, and `compute_ms`, the time the gateway waited on Triton. Replicas and workers add up "
    "(Redis when configured); figures are at most `GATEWAY_USAGE_FLUSH_INTERVAL_S` behind. Days default "
    f"to the last {_DEFAULT_DAYS} (today included); at most {MAX_DAYS} per query. `format=csv` returns "
    "the same rows as CSV."
)

Start = Annotated[dt.date | None, Query(description="first UTC day (default: 30 days before end)")]
End = Annotated[dt.date | None, Query(description="last UTC day (default: today)")]
Format = Annotated[Literal["json", "csv"], Query(description="json (default) or csv")]
ModelFilter = Annotated[str | None, Query(description="only this model", max_length=128)]


get_meter = app_state("meter")


def _days(start: dt.date | None, end: dt.date | None) -> tuple[dt.date, dt.date]:
    end = end or dt.datetime.now(dt.UTC).date()
    if start is None:
        # Near year 1 there are no 30 earlier days to count back: start at the first date there is.
        start = (
            end - dt.timedelta(days=_DEFAULT_DAYS - 1)
            if end > dt.date.min + dt.timedelta(days=_DEFAULT_DAYS)
            else dt.date.min
        )
    if start > end:
        raise BadRequest(f"start {start} is after end {end}", field="start")
    if (end - start).days + 1 > MAX_DAYS:
        raise BadRequest(f"at most {MAX_DAYS} days per query", field="start")
    return start, end


def _entry(row: UsageRow) -> UsageEntry:
    counts = row.counts()
    compute_us = counts.pop("compute_us")
    return UsageEntry(
        day=row.day,
        client=row.client,
        model=row.model,
        compute_ms=round(compute_us / 1000, 3),
        **counts,
    )


async def _report(
    meter: UsageMeter,
    client: str | None,
    start: dt.date | None,
    end: dt.date | None,
    model: str | None,
    fmt: str,
) -> UsageReport | Response:
    first, last = _days(start, end)
    try:
        rows = await meter.read(first.isoformat(), last.isoformat(), client)
    except UsageStoreError as exc:
        raise ServiceUnavailable(
            "the usage store cannot be read right now; retry shortly", retry_after_s=1
        ) from exc
    entries = [_entry(r) for r in rows if model is None or r.model == model]
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(_CSV_COLUMNS)
        for entry in entries:
            writer.writerow([getattr(entry, column) for column in _CSV_COLUMNS])
        return Response(
            buffer.getvalue(),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="usage-{first}-{last}.csv"'},
        )
    totals: dict[str, float] = {c: 0 for c in _CSV_COLUMNS[3:]}
    for entry in entries:
        for column in totals:
            totals[column] += getattr(entry, column)
    totals["compute_ms"] = round(totals["compute_ms"], 3)
    return UsageReport(start=first, end=last, client=client, data=entries, totals=totals)


_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {
            "application/json": {"example": _EXAMPLE},
            "text/csv": {
                "example": "day,client,model,requests,failed,images,inputs,tokens,compute_ms\n"
            },
        }
    },
}


@router.get(
    "/v1/usage",
    response_model=UsageReport,
    summary="The caller's own usage per model and day (JSON or CSV)",
    description=_DESCRIPTION
    + " A client credential sees its own usage only; the admin token sees every client.",
    responses={**_RESPONSES, **problem_responses(400, 401, 422, 503)},
)
async def own_usage(
    meter: Annotated[UsageMeter, Depends(get_meter)],
    ctx: Annotated[RequestContext, Depends(get_context)],
    start: Start = None,
    end: End = None,
    model: ModelFilter = None,
    format: Format = "json",
) -> UsageReport | Response:
    if ctx.principal is None:  # behind the auth middleware: a wiring bug, not a client error
        raise RuntimeError("/v1/usage reached without a principal")
    client = None if ctx.principal.kind == "admin" else ctx.principal.client_id
    return await _report(meter, client, start, end, model, format)


@router.get(
    "/admin/usage",
    response_model=UsageReport,
    summary="Usage of any client (or all) per model and day (JSON or CSV)",
    description=_DESCRIPTION,
    tags=["admin"],
    responses={**_RESPONSES, **problem_responses(400, 401, 403, 422, 503)},
)
async def admin_usage(
    meter: Annotated[UsageMeter, Depends(get_meter)],
    client: Annotated[
        str | None,
        Query(
            description="one client's id, e.g. key:3f9a0c1b2d4e or jwt:alice (default: every client)",
            max_length=300,
        ),
    ] = None,
    key_id: Annotated[
        str | None, Query(description="shorthand for client=key:<key_id>", max_length=64)
    ] = None,
    start: Start = None,
    end: End = None,
    model: ModelFilter = None,
    format: Format = "json",
) -> UsageReport | Response:
    if key_id is not None:
        if client is not None:
            raise BadRequest("give client or key_id, not both", field="key_id")
        client = f"key:{key_id}"
    return await _report(meter, client, start, end, model, format)
