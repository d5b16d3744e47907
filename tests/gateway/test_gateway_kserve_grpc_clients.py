"""``tritonclient.grpc`` (sync and aio) against the real gateway's gRPC entry, every call compared with
the same call straight to the real Triton's gRPC endpoint; the same credentials, scopes, limits,
checks and statistics as over HTTP, and errors as gRPC status codes with the gateway's message."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
from tritonclient.utils import InferenceServerException

from serving.ports import reserve_port
from tests.support.gateway_procs import ADMIN_TOKEN, METRICS_HEADERS

pytestmark = pytest.mark.integration

MODEL = "tiny_linear"
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


@pytest.fixture(scope="module")
def grpc_gateway(gateway_factory, tiny_triton):  # type: ignore[no-untyped-def]
    return gateway_factory(tiny_triton.http_url, grpc_port=reserve_port(), max_body_bytes=64 * 1024)


def _key(  # type: ignore[no-untyped-def]
    gateway, scopes: list[str], tier: str = "unlimited"
) -> dict[str, str]:
    created = httpx.post(
        gateway.url + "/admin/keys",
        json={"name": "grpc", "scopes": scopes, "tier": tier},
        headers={"X-Admin-Token": ADMIN_TOKEN},
        timeout=10,
    ).json()
    # gRPC metadata keys are lower case.
    return {"authorization": f"Bearer {created['api_key']}"}


@pytest.fixture(scope="module")
def auth(grpc_gateway) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return _key(grpc_gateway, [MODEL, "slow_echo"])


def _inputs(module, rows: np.ndarray = ROWS) -> list:  # type: ignore[no-untyped-def]
    tensor = module.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return [tensor]


def test_sync_client_sees_what_triton_says(  # type: ignore[no-untyped-def]
    grpc_gateway, tiny_triton, auth
) -> None:
    through = grpcclient.InferenceServerClient(grpc_gateway.grpc_url)
    direct = grpcclient.InferenceServerClient(tiny_triton.grpc_url)
    try:
        assert through.is_server_live() and through.is_server_ready()
        server = through.get_server_metadata(headers=auth, as_json=True)
        triton = direct.get_server_metadata(as_json=True)
        assert (server["name"], server["version"]) == (triton["name"], triton["version"])
        assert set(server["extensions"]) < set(triton["extensions"])
        for version in ("", "1"):
            assert through.is_model_ready(MODEL, version, headers=auth)
            assert through.get_model_metadata(
                MODEL, version, headers=auth, as_json=True
            ) == direct.get_model_metadata(MODEL, version, as_json=True)
            assert through.get_model_config(
                MODEL, version, headers=auth, as_json=True
            ) == direct.get_model_config(MODEL, version, as_json=True)
            got = through.infer(MODEL, _inputs(grpcclient), model_version=version, headers=auth)
            want = direct.infer(MODEL, _inputs(grpcclient), model_version=version)
            assert got.as_numpy("output").tobytes() == want.as_numpy("output").tobytes()
            assert got.get_response().model_name == MODEL
        # async_infer (a future on the same unary call) and a stream of requests.
        results: list = []
        through.async_infer(
            MODEL,
            _inputs(grpcclient),
            lambda result, error: results.append((result, error)),
            headers=auth,
        )
        through.start_stream(lambda result, error: results.append((result, error)), headers=auth)
        through.async_stream_infer(MODEL, _inputs(grpcclient, ROWS[:1]), request_id="s1")
        bad = grpcclient.InferInput("input", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        through.async_stream_infer(MODEL, [bad], request_id="s2")
        through.stop_stream()
        want_one = direct.infer(MODEL, _inputs(grpcclient, ROWS[:1])).as_numpy("output")
        ok = [r for r, e in results if e is None]
        errors = [e for _, e in results if e is not None]
        assert len(ok) == 2 and len(errors) == 1, results
        assert {r.as_numpy("output").tobytes() for r in ok} >= {want_one.tobytes()}
        assert "input" in errors[0].message()
    finally:
        through.close()
        direct.close()


async def test_aio_client_sees_what_triton_says(  # type: ignore[no-untyped-def]
    grpc_gateway, tiny_triton, auth
) -> None:
    through = grpc_aio.InferenceServerClient(grpc_gateway.grpc_url)
    direct = grpc_aio.InferenceServerClient(tiny_triton.grpc_url)
    try:
        assert await through.is_server_ready()
        for version in ("", "1"):
            assert await through.is_model_ready(MODEL, version, headers=auth)
            assert await through.get_model_metadata(
                MODEL, version, headers=auth, as_json=True
            ) == await direct.get_model_metadata(MODEL, version, as_json=True)
            assert await through.get_model_config(
                MODEL, version, headers=auth, as_json=True
            ) == await direct.get_model_config(MODEL, version, as_json=True)
            got = await through.infer(MODEL, _inputs(grpc_aio), model_version=version, headers=auth)
            want = await direct.infer(MODEL, _inputs(grpc_aio), model_version=version)
            assert got.as_numpy("output").tobytes() == want.as_numpy("output").tobytes()
        # BYTES and INT32 through the Python backend, and a deadline the gateway passes on.
        delay = grpc_aio.InferInput("DELAY_MS", [1], "INT32")
        delay.set_data_from_numpy(np.array([3], dtype=np.int32))
        echoed = await through.infer("slow_echo", [delay], headers=auth, client_timeout=10)
        assert echoed.as_numpy("OUT").tolist() == [3]
    finally:
        await through.close()
        await direct.close()


def test_errors_are_status_codes_with_the_gateways_message(  # type: ignore[no-untyped-def]
    grpc_gateway, auth
) -> None:
    client = grpcclient.InferenceServerClient(grpc_gateway.grpc_url)

    def refused(call, *args, **kwargs) -> InferenceServerException:  # type: ignore[no-untyped-def]
        with pytest.raises(InferenceServerException) as caught:
            call(*args, **kwargs)
        return caught.value

    try:
        missing = refused(client.infer, MODEL, _inputs(grpcclient))
        assert (
            missing.status() == "StatusCode.UNAUTHENTICATED"
            and "missing credential" in missing.message()
        )
        wrong = refused(
            client.infer, MODEL, _inputs(grpcclient), headers={"authorization": "Bearer gk_nope"}
        )
        assert wrong.status() == "StatusCode.UNAUTHENTICATED"
        scope = refused(client.get_model_metadata, "resnet50", headers=auth)
        assert scope.status() == "StatusCode.PERMISSION_DENIED" and "resnet50" in scope.message()
        version = refused(client.infer, MODEL, _inputs(grpcclient), model_version="7", headers=auth)
        assert version.status() == "StatusCode.NOT_FOUND" and MODEL in version.message()
        bad = grpcclient.InferInput("input", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
        shape = refused(client.infer, MODEL, [bad], headers=auth)
        assert shape.status() == "StatusCode.INVALID_ARGUMENT" and "input" in shape.message()
        # The REST parser's own checks: a priority is the gateway's to set, shared memory is refused.
        prio = refused(client.infer, MODEL, _inputs(grpcclient), priority=1, headers=auth)
        assert prio.status() == "StatusCode.INVALID_ARGUMENT" and "priority" in prio.message()
        shm = grpcclient.InferInput("input", [3, 4], "FP32")
        shm.set_shared_memory("region", 48)
        shared = refused(client.infer, MODEL, [shm], headers=auth)
        assert (
            shared.status() == "StatusCode.INVALID_ARGUMENT" and "shared memory" in shared.message()
        )
        big = np.zeros((8, 4096), dtype=np.float32)  # 128 KB: over this gateway's 64 KB body cap
        too_big = refused(client.infer, MODEL, _inputs(grpcclient, big), headers=auth)
        assert too_big.status() == "StatusCode.RESOURCE_EXHAUSTED"
        index = refused(client.get_model_repository_index, headers=auth)
        assert (
            index.status() == "StatusCode.PERMISSION_DENIED"
            and "admin credential" in index.message()
        )
        assert client.infer(MODEL, _inputs(grpcclient), headers=auth).as_numpy("output").shape == (
            3,
            2,
        )
    finally:
        client.close()


def test_rate_limits_and_statistics_are_shared_with_http(  # type: ignore[no-untyped-def]
    grpc_gateway,
) -> None:
    auth = _key(grpc_gateway, [MODEL], tier="tiny")  # a burst of 4, then one a minute
    client = grpcclient.InferenceServerClient(grpc_gateway.grpc_url)
    try:
        served = [client.infer(MODEL, _inputs(grpcclient), headers=auth) for _ in range(2)]
        assert len(served) == 2
        http_auth = {"Authorization": auth["authorization"]}
        body = {
            "inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
        }
        for _ in range(2):  # the same bucket over HTTP
            assert (
                httpx.post(
                    grpc_gateway.url + f"/v2/models/{MODEL}/infer", json=body, headers=http_auth
                ).status_code
                == 200
            )
        with pytest.raises(InferenceServerException) as limited:
            client.infer(MODEL, _inputs(grpcclient), headers=auth)
        assert (
            limited.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            and "rate limit" in limited.value.message()
        )
    finally:
        client.close()
    metrics = httpx.get(grpc_gateway.url + "/metrics", headers=METRICS_HEADERS).text
    served_lines = [
        line
        for line in metrics.splitlines()
        if line.startswith("gateway_request_duration_seconds_count") and f'model="{MODEL}"' in line
    ]
    assert any('status="200"' in line for line in served_lines), served_lines
    assert (
        "gRPC ModelInfer 200" in grpc_gateway.log() and "gRPC ModelInfer 429" in grpc_gateway.log()
    )


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ("request", "shared_memory_region"),
        ("request", "shared_memory_byte_size"),
        ("request", "sequence_id"),
        ("request", "sequence_start"),
        ("request", "priority"),
        ("input", "sequence_end"),
        ("input", "priority"),
        ("input", "timeout"),
        ("output", "shared_memory_offset"),
        ("output", "priority"),
    ],
)
def test_triton_only_parameters_are_refused_over_grpc(
    grpc_gateway, auth, where: str, name: str
) -> None:  # type: ignore[no-untyped-def]
    # The raw protobuf request: tritonclient would not let a caller put these everywhere.
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 4])
    tensor.contents.fp32_contents.extend([1, 2, 3, 4])
    output = request.outputs.add(name="output")
    holder = {"request": request, "input": tensor, "output": output}[where]
    holder.parameters[name].int64_param = 1
    with grpc.insecure_channel(grpc_gateway.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
                request, metadata=list(auth.items()), timeout=20
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert name in (refused.value.details() or ""), refused.value.details()
