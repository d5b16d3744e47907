"""Signed image URLs and the generation pace, alone (the route is tested end to end in
test_gateway_images_default.py)."""

from __future__ import annotations

import pytest

from gateway.errors import Gone, PermissionDenied
from gateway.jobs.image_urls import ImageUrlSigner
from gateway.observe.generation_pace import GenerationPace, generation_work
from tests.support.fake_clock import FakeClock

PATH = "/v1/images/files/abc"


def test_a_signed_url_opens_until_it_expires() -> None:
    clock = FakeClock(1_000_000.0)
    signer = ImageUrlSigner("secret", clock)
    url = signer.sign(PATH, 600)
    assert url.relative().startswith(PATH + "?expires=1000600&signature=")
    assert signer.check(PATH, str(url.expires), url.signature) == url.expires
    assert signer.remaining_s(url.expires) == 600
    clock.now += 600
    with pytest.raises(Gone):
        signer.check(PATH, str(url.expires), url.signature)


@pytest.mark.parametrize(
    "change",
    [
        "path",
        "expires",
        "signature",
        "missing",
        "not-a-number",
        "other-secret",
        "non-ascii-path",
        "non-ascii-signature",
        "other-script-digits",
    ],
)
def test_an_altered_url_is_refused(change: str) -> None:
    signer = ImageUrlSigner("secret", FakeClock(1_000_000.0))
    url = signer.sign(PATH, 600)
    path, expires, signature = PATH, str(url.expires), url.signature
    checker = signer
    if change == "path":
        path = "/v1/images/files/abd"
    elif change == "expires":
        expires = str(url.expires + 1)
    elif change == "signature":
        signature = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    elif change == "missing":
        signature = ""
    elif change == "not-a-number":
        expires = "-5"
    elif change == "non-ascii-path":  # what a fuzzer sends: found a 500 once
        path = "/v1/images/files/\u169b\u1684"
    elif change == "non-ascii-signature":
        signature = "\u169b" * len(signature)
    elif (
        change == "other-script-digits"
    ):  # int() reads Arabic-Indic digits; the URL's expires is ASCII
        expires = "\u0661" * 7
    else:
        checker = ImageUrlSigner("another secret", FakeClock(1_000_000.0))
    with pytest.raises(PermissionDenied):
        checker.check(path, expires, signature)


def test_the_key_is_derived_not_the_secret_itself() -> None:
    # Two processes with one secret agree; with no secret each draws its own key.
    assert ImageUrlSigner("s", FakeClock(1_000_000.0)).sign(PATH, 1) == ImageUrlSigner(
        "s", FakeClock(1_000_000.0)
    ).sign(PATH, 1)
    assert ImageUrlSigner("", FakeClock(1_000_000.0)).sign(PATH, 1) != ImageUrlSigner(
        "", FakeClock(1_000_000.0)
    ).sign(PATH, 1)
    assert ImageUrlSigner("", FakeClock(1_000_000.0)).process_local


def test_pace_estimates_from_what_ran() -> None:
    pace = GenerationPace()
    work = generation_work(1, 25, 64, 64)
    assert pace.estimate_s("sd", work) is None
    pace.observe("sd", work, 1.0)
    assert pace.estimate_s("sd", work) == pytest.approx(1.0)
    assert pace.estimate_s("sd", generation_work(1, 50, 128, 128)) == pytest.approx(8.0)
    pace.observe("sd", work, 2.0)
    assert 1.0 < pace.estimate_s("sd", work) < 2.0  # type: ignore[operator]
    assert pace.estimate_s("other", work) is None
