"""``tritonclient``'s operator calls through the real gateway: ``get_model_repository_index`` and
``get_inference_statistics`` (HTTP sync and aio, gRPC sync and aio), with the admin credential, against
the real Triton; an API key is refused with 403 / PERMISSION_DENIED naming the admin credential, no
credential with 401 / UNAUTHENTICATED. Both gateway -> Triton transports (HTTP and gRPC) are used.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as http
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from serving.ports import reserve_port
from tests.support.gateway_procs import ADMIN_TOKEN

pytestmark = pytest.mark.integration

MODEL = "tiny_linear"
ADMIN_HTTP = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ADMIN_GRPC = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module", params=["http", "grpc"])
def admin_gateway(request, gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    """A gateway with a gRPC entry, talking to Triton over HTTP or over gRPC."""
    return gateway_factory(
        tiny_triton.http_url,
        grpc_port=reserve_port(),
        triton_protocol=request.param,
        triton_grpc_url=tiny_triton.grpc_url,
    )


@pytest.fixture(scope="module")
def key(admin_gateway) -> str:  # type: ignore[no-untyped-def]
    created = httpx.post(
        admin_gateway.url + "/admin/keys",
        json={"name": "ops", "scopes": ["*"], "tier": "unlimited"},
        headers={"X-Admin-Token": ADMIN_TOKEN},
        timeout=10,
    ).json()
    return str(created["api_key"])


def _infer_once(url: str, key: str) -> None:
    rows = np.ones((2, 4), dtype=np.float32)
    tensor = http.InferInput("input", [2, 4], "FP32")
    tensor.set_data_from_numpy(rows)
    with http.InferenceServerClient(url) as client:
        client.infer(MODEL, [tensor], headers={"Authorization": f"Bearer {key}"})


def _counts(stats: dict) -> dict[tuple[str, str], int]:  # type: ignore[type-arg]
    return {(m["name"], m["version"]): int(m["inference_count"]) for m in stats["model_stats"]}


def test_http_client_reads_the_index_and_statistics_with_the_admin_credential(
    admin_gateway, tiny_triton, key
) -> None:  # type: ignore[no-untyped-def]
    through = http.InferenceServerClient(admin_gateway.url.removeprefix("http://"))
    direct = http.InferenceServerClient(tiny_triton.http_url)
    try:
        assert (
            through.get_model_repository_index(headers=ADMIN_HTTP)
            == direct.get_model_repository_index()
        )
        _infer_once(admin_gateway.url.removeprefix("http://"), key)
        every = through.get_inference_statistics(headers=ADMIN_HTTP)
        assert _counts(every).keys() == _counts(direct.get_inference_statistics()).keys()
        one = through.get_inference_statistics(MODEL, headers=ADMIN_HTTP)
        assert [m["name"] for m in one["model_stats"]] == [MODEL]
        # What Triton counted, read through the gateway after the inference above, and never more than now.
        counted = _counts(one)[(MODEL, "1")]
        assert 1 <= counted <= _counts(direct.get_inference_statistics(MODEL))[(MODEL, "1")]
        version = through.get_inference_statistics(MODEL, "1", headers=ADMIN_HTTP)
        assert [(m["name"], m["version"]) for m in version["model_stats"]] == [(MODEL, "1")]

        with pytest.raises(InferenceServerException) as unknown:
            through.get_inference_statistics("no_such_model", headers=ADMIN_HTTP)
        assert unknown.value.status() == "404" and "no_such_model" in unknown.value.message()
        for call in (through.get_model_repository_index, through.get_inference_statistics):
            with pytest.raises(InferenceServerException) as denied:
                call(headers={"Authorization": f"Bearer {key}"})
            assert denied.value.status() == "403" and "admin credential" in denied.value.message()
            with pytest.raises(InferenceServerException) as anonymous:
                call()
            assert anonymous.value.status() == "401"
    finally:
        through.close()
        direct.close()


def test_the_index_takes_triton_s_ready_filter_and_refuses_other_bodies(
    admin_gateway, tiny_triton, key
) -> None:  # type: ignore[no-untyped-def]
    url = admin_gateway.url + "/v2/repository/index"
    ready = httpx.post(url, json={"ready": True}, headers=ADMIN_HTTP)
    assert ready.status_code == 200 and ready.json()
    assert all(entry["state"] == "READY" for entry in ready.json())
    assert (
        ready.json()
        == httpx.post(
            f"http://{tiny_triton.http_url}/v2/repository/index", json={"ready": True}
        ).json()
    )
    for body in ('{"ready": "yes"}', '{"load": "x"}', "[1]", "{"):
        refused = httpx.post(
            url, content=body, headers={**ADMIN_HTTP, "Content-Type": "application/json"}
        )
        assert refused.status_code == 400 and "error" in refused.json(), body
    keyed = httpx.get(
        admin_gateway.url + "/v2/models/stats", headers={"Authorization": f"Bearer {key}"}
    )
    assert (
        keyed.status_code == 403 and "model_stats" not in keyed.text
    )  # Triton's statistics never leak to a key


async def test_aio_clients(admin_gateway, tiny_triton) -> None:  # type: ignore[no-untyped-def]
    through = http_aio.InferenceServerClient(admin_gateway.url.removeprefix("http://"))
    direct = http_aio.InferenceServerClient(tiny_triton.http_url)
    grpc_through = grpc_aio.InferenceServerClient(admin_gateway.grpc_url)
    try:
        assert (
            await through.get_model_repository_index(headers=ADMIN_HTTP)
            == await direct.get_model_repository_index()
        )
        stats = await through.get_inference_statistics(MODEL, headers=ADMIN_HTTP)
        assert [m["name"] for m in stats["model_stats"]] == [MODEL]
        index = await grpc_through.get_model_repository_index(headers=ADMIN_GRPC)
        assert {m.name for m in index.models} == {
            m["name"] for m in await direct.get_model_repository_index()
        }
        grpc_stats = await grpc_through.get_inference_statistics(MODEL, headers=ADMIN_GRPC)
        assert [m.name for m in grpc_stats.model_stats] == [MODEL]
    finally:
        await through.close()
        await direct.close()
        await grpc_through.close()


def test_grpc_client_reads_the_index_and_statistics_with_the_admin_credential(
    admin_gateway, tiny_triton, key
) -> None:  # type: ignore[no-untyped-def]
    through = grpcclient.InferenceServerClient(admin_gateway.grpc_url)
    direct = grpcclient.InferenceServerClient(tiny_triton.grpc_url)
    try:
        assert through.get_model_repository_index(
            headers=ADMIN_GRPC, as_json=True
        ) == direct.get_model_repository_index(as_json=True)
        index = through.get_model_repository_index(
            headers=ADMIN_GRPC
        )  # the protobuf, as the client gives it
        assert {m.name for m in index.models} >= {MODEL} and all(
            m.state == "READY" for m in index.models
        )
        _infer_once(admin_gateway.url.removeprefix("http://"), key)
        stats = through.get_inference_statistics(MODEL, headers=ADMIN_GRPC, as_json=True)
        triton = direct.get_inference_statistics(MODEL, as_json=True)
        assert [m["name"] for m in stats["model_stats"]] == [MODEL]
        # The same fields Triton's own answer has, and counts no larger than Triton's (read after).
        assert stats["model_stats"][0].keys() == triton["model_stats"][0].keys()
        assert (
            1
            <= int(stats["model_stats"][0]["inference_count"])
            <= int(triton["model_stats"][0]["inference_count"])
        )
        every = through.get_inference_statistics(headers=ADMIN_GRPC)
        assert {m.name for m in every.model_stats} == {
            m.name for m in direct.get_inference_statistics().model_stats
        }

        with pytest.raises(InferenceServerException) as unknown:
            through.get_inference_statistics("no_such_model", headers=ADMIN_GRPC)
        assert unknown.value.status() == "StatusCode.NOT_FOUND"
        for call in (through.get_model_repository_index, through.get_inference_statistics):
            with pytest.raises(InferenceServerException) as denied:
                call(headers={"authorization": f"Bearer {key}"})
            assert (
                denied.value.status() == "StatusCode.PERMISSION_DENIED"
                and "admin credential" in denied.value.message()
            )
            with pytest.raises(InferenceServerException) as anonymous:
                call()
            assert anonymous.value.status() == "StatusCode.UNAUTHENTICATED"
    finally:
        through.close()
        direct.close()
