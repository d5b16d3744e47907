"""``tritonclient.http`` (sync and aio) against the real gateway, every KServe v2 call a client makes,
each answer compared with the same call straight to the real Triton."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as http
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

MODEL = "tiny_linear"
ROWS = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


@pytest.fixture(scope="module")
def auth(admin) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return admin.headers(admin.create_key(scopes=[MODEL, "slow_echo"]))  # type: ignore[no-any-return]


def _inputs(module) -> list:  # type: ignore[no-untyped-def]
    tensor = module.InferInput("input", list(ROWS.shape), "FP32")
    tensor.set_data_from_numpy(ROWS, binary_data=True)
    return [tensor]


def test_sync_client_sees_what_triton_says(  # type: ignore[no-untyped-def]
    gateway, tiny_triton, auth
) -> None:
    through = http.InferenceServerClient(gateway.url.removeprefix("http://"))
    direct = http.InferenceServerClient(tiny_triton.http_url)
    try:
        assert through.is_server_live(headers=auth) and through.is_server_ready(headers=auth)
        server, triton = through.get_server_metadata(headers=auth), direct.get_server_metadata()
        assert (server["name"], server["version"]) == (triton["name"], triton["version"])
        assert (
            "binary_tensor_data" in server["extensions"]
            and "model_configuration" in server["extensions"]
        )
        assert set(server["extensions"]) < set(triton["extensions"]), (
            "shared memory etc. are not offered"
        )
        for version in ("", "1"):
            assert through.is_model_ready(MODEL, version, headers=auth)
            assert through.get_model_metadata(
                MODEL, version, headers=auth
            ) == direct.get_model_metadata(MODEL, version)
            assert through.get_model_config(
                MODEL, version, headers=auth
            ) == direct.get_model_config(MODEL, version)
            got = through.infer(MODEL, _inputs(http), model_version=version, headers=auth).as_numpy(
                "output"
            )
            want = direct.infer(MODEL, _inputs(http), model_version=version).as_numpy("output")
            assert got.dtype == np.float32 and got.tobytes() == want.tobytes()
    finally:
        through.close()
        direct.close()


async def test_aio_client_sees_what_triton_says(  # type: ignore[no-untyped-def]
    gateway, tiny_triton, auth
) -> None:
    through = http_aio.InferenceServerClient(gateway.url.removeprefix("http://"))
    direct = http_aio.InferenceServerClient(tiny_triton.http_url)
    try:
        assert await through.is_server_ready(headers=auth)
        assert (await through.get_server_metadata(headers=auth))["version"] == (
            await direct.get_server_metadata()
        )["version"]
        for version in ("", "1"):
            assert await through.is_model_ready(MODEL, version, headers=auth)
            assert await through.get_model_metadata(
                MODEL, version, headers=auth
            ) == await direct.get_model_metadata(MODEL, version)
            assert await through.get_model_config(
                MODEL, version, headers=auth
            ) == await direct.get_model_config(MODEL, version)
            got = (
                await through.infer(MODEL, _inputs(http_aio), model_version=version, headers=auth)
            ).as_numpy("output")
            want = (await direct.infer(MODEL, _inputs(http_aio), model_version=version)).as_numpy(
                "output"
            )
            assert got.tobytes() == want.tobytes()
    finally:
        await through.close()
        await direct.close()


def test_errors_reach_tritonclient_as_messages(gateway, auth) -> None:  # type: ignore[no-untyped-def]
    client = http.InferenceServerClient(gateway.url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException, match="missing credential") as refused:
            client.get_model_metadata(MODEL)
        assert refused.value.status() == "401"
        with pytest.raises(
            InferenceServerException, match="not allowed to use model 'resnet50'"
        ) as denied:
            client.get_model_config("resnet50", headers=auth)
        assert denied.value.status() == "403"
        with pytest.raises(InferenceServerException, match="tiny_linear") as missing:
            client.infer(MODEL, _inputs(http), model_version="7", headers=auth)
        assert missing.value.status() == "404"
        with pytest.raises(InferenceServerException, match="input") as bad:
            wrong = http.InferInput("input", [1, 3], "FP32")
            wrong.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
            client.infer(MODEL, [wrong], headers=auth)
        assert bad.value.status() == "400"
        assert not client.is_model_ready(MODEL, "7", headers=auth)
    finally:
        client.close()
