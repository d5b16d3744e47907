"""Image generation as jobs, through the real gateway in front of the real Triton serving the tiny
Stable Diffusion checkpoint, with a real Redis and a real HTTP server receiving the callbacks.

Submit, poll, fetch the result (the image equals the synchronous route's for the same seed), owner-only
access, cancel (queued and running: a running job's result is dropped), a signed callback verified by
the receiver while callbacks off the allow-list are refused, and jobs surviving gateway restarts (Redis
and SQLite), including a worker killed mid-run whose job another worker takes over.
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.support.callback_receiver import CallbackReceiver
from tests.support.gateway_procs import ADMIN_TOKEN, GatewayProcess, create_key

pytestmark = pytest.mark.integration

SECRET = "test-callback-secret-0d41e7b29c"
#: a tiny-SD request that takes a few hundred milliseconds
QUICK = {"prompt": "a red fox", "n": 1, "size": "64x64", "steps": 2, "seed": 5}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # the admin credential on client routes


@pytest.fixture(scope="module")
def receiver() -> Iterator[CallbackReceiver]:
    server = CallbackReceiver(SECRET.encode()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def job_settings(receiver: CallbackReceiver, redis_url: str) -> dict[str, Any]:
    """Settings every gateway of this module shares: one Redis namespace, the receiver allow-listed."""
    return {
        "redis_url": redis_url,
        "redis_prefix": f"jobs{uuid.uuid4().hex[:6]}:",
        # The receiver by address (allowed as written), and by a name that resolves to loopback (refused).
        "callback_allow": [receiver.url, f"http://localhost:{receiver.port}"],
        "callback_secret": SECRET,
        "job_lease_s": 2,
        "job_heartbeat_s": 0.2,
        "job_poll_interval_s": 0.2,
        "callback_backoff_s": 0.2,
        "max_body_bytes": 64 * 1024,
    }


@pytest.fixture(scope="module")
def worker(gateway_factory, sd_triton, job_settings) -> GatewayProcess:  # type: ignore[no-untyped-def]
    """A gateway that runs jobs (one at a time)."""
    return gateway_factory(sd_triton.http_url, **job_settings)  # type: ignore[no-any-return]


def _wait(what: str, check: Callable[[], Any], timeout_s: float = 180.0) -> Any:
    """Poll ``check`` until it returns something truthy (a job reaching a state, a callback arriving)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.1)


def _job(gateway: GatewayProcess, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{gateway.url}/v1/images/jobs/{job_id}", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def _until(
    gateway: GatewayProcess, headers: dict[str, str], job_id: str, *statuses: str
) -> dict[str, Any]:
    return _wait(
        f"job {job_id} to be {statuses}",  # type: ignore[no-any-return]
        lambda: (job := _job(gateway, headers, job_id))["status"] in statuses and job,
    )


def _submit(gateway: GatewayProcess, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(
        f"{gateway.url}/v1/images/jobs", json={**QUICK, **body}, headers=headers, timeout=30
    )


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _triton_done(sd_triton) -> int:  # type: ignore[no-untyped-def]
    """Requests the pipeline model has finished (successfully or not), from Triton's own statistics."""
    stats = httpx.get(
        f"http://{sd_triton.http_url}/v2/models/stable_diffusion/stats", timeout=10
    ).json()
    inference = stats["model_stats"][0]["inference_stats"]
    return int(inference["success"]["count"]) + int(inference["fail"]["count"])


def test_submit_poll_result_and_a_signed_callback(worker, receiver) -> None:  # type: ignore[no-untyped-def]
    headers, _ = create_key(worker)
    sync = httpx.post(
        f"{worker.url}/v1/images/generations", json=QUICK, headers=headers, timeout=120
    )
    assert sync.status_code == 200, sync.text
    expected = base64.b64decode(sync.json()["data"][0]["b64_json"])

    submitted = _submit(
        worker, headers, callback_url=f"{receiver.url}/hooks/generation?source=test"
    )
    assert submitted.status_code == 202, submitted.text
    job = submitted.json()
    assert job["object"] == "image.generation.job" and job["status"] in ("queued", "running")
    assert submitted.headers["location"] == f"/v1/images/jobs/{job['id']}"
    assert job["request"]["seed"] == 5 and job["callback"]["state"] == "waiting"

    done = _until(worker, headers, job["id"], "succeeded", "failed")
    assert done["status"] == "succeeded" and done["images"] == 1 and done["attempts"] == 1, done
    result = httpx.get(
        f"{worker.url}/v1/images/jobs/{job['id']}/result", headers=headers, timeout=10
    )
    assert result.status_code == 200, result.text
    image = base64.b64decode(result.json()["data"][0]["b64_json"])
    assert image == expected and _pixels(image).shape == (64, 64, 3), (
        "the job's image is the synchronous one"
    )

    # The callback: a real POST to the receiver, signed with the deployment's secret.
    arrived = receiver.wait_for(1)[-1]
    assert arrived.verified, "the receiver's own HMAC check passed"
    assert (
        arrived.path == "/hooks/generation?source=test"
        and arrived.headers["gateway-job-id"] == job["id"]
    )
    event = json.loads(arrived.body)
    assert event["type"] == "image.generation.job.succeeded" and event["data"]["id"] == job["id"]
    assert event["data"]["status"] == "succeeded" and len(arrived.body) < 2000, (
        "the event carries no image"
    )
    _wait(
        "the delivery recorded",
        lambda: _job(worker, headers, job["id"])["callback"]["state"] == "delivered",
    )

    # Owner only: another key (and no key) cannot tell the job exists; the admin can read it.
    other, _ = create_key(worker)
    for method, path in (
        ("GET", ""),
        ("GET", "/result"),
        ("POST", "/cancel"),
        ("DELETE", ""),
        ("GET", "/images/0"),
    ):
        refused = httpx.request(
            method, f"{worker.url}/v1/images/jobs/{job['id']}{path}", headers=other, timeout=10
        )
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found", (
            path,
            refused.text,
        )
    assert httpx.get(f"{worker.url}/v1/images/jobs/{job['id']}", timeout=10).status_code == 401
    assert httpx.get(f"{worker.url}/v1/images/jobs", headers=other, timeout=10).json()["data"] == []
    assert _job(worker, ADMIN, job["id"])["status"] == "succeeded"
    everyone = httpx.get(
        f"{worker.url}/v1/images/jobs?limit=100", headers=ADMIN, timeout=10
    ).json()["data"]
    assert job["id"] in {j["id"] for j in everyone}
    assert (
        httpx.get(
            f"{worker.url}/v1/images/jobs/{job['id']}/result", headers=ADMIN, timeout=10
        ).status_code
        == 404
    )

    # url results point at the job's own image route, signed; delete removes job and images.
    linked = _submit(worker, headers, response_format="url", output_format="webp").json()
    _until(worker, headers, linked["id"], "succeeded")
    url = httpx.get(f"{worker.url}/v1/images/jobs/{linked['id']}/result", headers=headers).json()[
        "data"
    ][0]["url"]
    assert url.startswith(f"{worker.url}/v1/images/jobs/{linked['id']}/images/0?expires=")
    fetched = httpx.get(url, timeout=10)  # signed: no key needed
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "image/webp"
    assert "private" in fetched.headers["cache-control"]
    assert (
        httpx.get(url.split("?")[0], headers=headers, timeout=10).status_code == 200
    )  # the owner's key works too
    assert (
        httpx.get(url.replace("images/0?", "images/1?"), timeout=10).status_code == 403
    )  # altered
    assert (
        httpx.delete(f"{worker.url}/v1/images/jobs/{linked['id']}", headers=headers).json()[
            "deleted"
        ]
        is True
    )
    assert httpx.get(url, timeout=10).status_code == 404
    assert len(receiver.received) == 1, "a job without callback_url announces nothing"


def test_bad_submissions_and_refused_callbacks(worker, receiver) -> None:  # type: ignore[no-untyped-def]
    headers, _ = create_key(worker)
    before = len(receiver.received)
    cases = [
        (
            {"callback_url": f"http://localhost:{receiver.port}/hook"},
            "callback_refused",
            "loopback",
        ),
        (
            {"callback_url": "http://169.254.169.254/latest/meta-data/"},
            "callback_refused",
            "allow-list",
        ),
        (
            {"callback_url": f"http://127.0.0.1:{receiver.port + 1}/hook"},
            "callback_refused",
            "allow-list",
        ),
        (
            {"callback_url": f"https://127.0.0.1:{receiver.port}/hook"},
            "callback_refused",
            "allow-list",
        ),
        (
            {"callback_url": f"http://user:pw@127.0.0.1:{receiver.port}/"},
            "callback_refused",
            "credentials",
        ),
        ({"size": "65x64"}, "bad_request", "multiple of 8"),
        ({"n": 5}, "validation_error", "n"),
        ({"model": "sd_unet"}, "model_not_found", "does not serve"),
        ({"model": "no_such_model"}, "model_not_found", "not served by Triton"),
    ]
    for body, code, words in cases:
        refused = _submit(worker, headers, **body)
        assert refused.status_code in (400, 404), refused.text
        error = refused.json()["error"]
        assert error["code"] == code and words in error["message"], (body, error)
    assert httpx.get(f"{worker.url}/v1/images/jobs", headers=headers).json()["data"] == [], (
        "nothing was queued"
    )
    for bogus in ("nope", "imgjob_" + "x" * 24, "imgjob_" + "x" * 57):
        missing = httpx.get(f"{worker.url}/v1/images/jobs/{bogus}", headers=headers, timeout=10)
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "job_id", (
            missing.text
        )
    assert len(receiver.received) == before, "no request went to a refused address"


def test_cancel_a_running_job_drops_its_result(worker, sd_triton) -> None:  # type: ignore[no-untyped-def]
    headers, _ = create_key(worker)
    finished_before = _triton_done(sd_triton)
    # Long enough (seconds of Triton work) that it is still running when the cancel arrives.
    job = _submit(worker, headers, steps=20).json()
    _until(worker, headers, job["id"], "running")
    cancel = httpx.post(
        f"{worker.url}/v1/images/jobs/{job['id']}/cancel", headers=headers, timeout=10
    )
    assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled", cancel.text
    # Triton finishes the pipeline run it had started; the gateway writes nothing of it.
    _wait("Triton to finish the abandoned run", lambda: _triton_done(sd_triton) > finished_before)
    after = _job(worker, headers, job["id"])
    assert after["status"] == "cancelled" and after["images"] == 0 and after["error"] is None
    result = httpx.get(
        f"{worker.url}/v1/images/jobs/{job['id']}/result", headers=headers, timeout=10
    )
    assert result.status_code == 409 and result.json()["error"]["code"] == "job_not_finished"
    again = httpx.post(
        f"{worker.url}/v1/images/jobs/{job['id']}/cancel", headers=headers, timeout=10
    )
    assert (
        again.status_code == 409 and "already ended (cancelled)" in again.json()["error"]["message"]
    )
    # The worker is free again: the next job runs.
    assert (
        _until(worker, headers, _submit(worker, headers).json()["id"], "succeeded", "failed")[
            "status"
        ]
        == "succeeded"
    )


def test_jobs_survive_restarts_with_redis(
    gateway_factory,
    sd_triton,
    job_settings,  # type: ignore[no-untyped-def]
    receiver,
) -> None:
    # A namespace of its own, so no other test's worker takes these jobs.
    job_settings = {**job_settings, "redis_prefix": f"restart{uuid.uuid4().hex[:6]}:"}
    # A gateway that accepts jobs but runs none: what it queues waits in Redis.
    front = gateway_factory(sd_triton.http_url, job_workers=0, **job_settings)
    headers, _ = create_key(front)
    waiting = _submit(front, headers, seed=11, callback_url=f"{receiver.url}/restart").json()
    cancelled = _submit(front, headers, seed=12).json()
    assert httpx.post(
        f"{front.url}/v1/images/jobs/{cancelled['id']}/cancel", headers=headers
    ).json()["status"] == ("cancelled")
    # The per-key limit on queued jobs (serving/limits.py: 8): one queued already, seven more fit.
    extra = [_submit(front, headers, seed=20 + k) for k in range(8)]
    assert [r.status_code for r in extra] == [202] * 7 + [429], [r.text for r in extra]
    assert (
        extra[-1].json()["error"]["code"] == "too_many_jobs"
        and "at most 8" in extra[-1].json()["error"]["message"]
    )
    for response in extra[:-1]:
        httpx.post(
            f"{front.url}/v1/images/jobs/{response.json()['id']}/cancel",
            headers=headers,
            timeout=10,
        )
    front.stop()

    # Another replica picks the job up from Redis and runs it; its callback is sent from there.
    back = gateway_factory(sd_triton.http_url, **job_settings)
    done = _until(back, headers, waiting["id"], "succeeded", "failed")
    assert done["status"] == "succeeded", done
    arrived = _wait(
        "the restart callback", lambda: [r for r in receiver.received if r.path == "/restart"]
    )
    assert arrived[0].verified and json.loads(arrived[0].body)["data"]["id"] == waiting["id"]
    assert _job(back, headers, cancelled["id"])["status"] == "cancelled", (
        "a cancelled job stays cancelled"
    )

    # A worker killed mid-run: its lease runs out and another worker runs the job again.
    slow = _submit(back, headers, steps=20, seed=13).json()
    _until(back, headers, slow["id"], "running")
    back.process.kill()
    again = gateway_factory(sd_triton.http_url, **job_settings)
    taken_over = _until(again, headers, slow["id"], "succeeded", "failed")
    assert taken_over["status"] == "succeeded" and taken_over["attempts"] == 2, taken_over
    # Results outlive the process that made them ("back" is gone).
    for job_id in (waiting["id"], slow["id"]):
        assert (
            httpx.get(f"{again.url}/v1/images/jobs/{job_id}/result", headers=headers).status_code
            == 200
        )
    again.stop()


def test_jobs_survive_a_restart_with_sqlite(  # type: ignore[no-untyped-def]
    gateway_factory, sd_triton, tmp_path
) -> None:
    # The single-process default: keys and jobs in SQLite files next to each other.
    first = gateway_factory(
        sd_triton.http_url, workdir=tmp_path, job_workers=0, job_poll_interval_s=0.2
    )
    headers, _ = create_key(first)
    job = _submit(first, headers, seed=7).json()
    first.stop()
    second = gateway_factory(sd_triton.http_url, workdir=tmp_path, job_poll_interval_s=0.2)
    assert _until(second, headers, job["id"], "succeeded", "failed")["status"] == "succeeded"
    assert (tmp_path / "gateway_jobs.sqlite3").exists()
    second.stop()
