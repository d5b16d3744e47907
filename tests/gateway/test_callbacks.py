"""Callbacks: the allow-list, the address checks (DNS answers included), the signature, and delivery to
a real local HTTP server (redirects not followed, retries only where they can help)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.errors import CallbackRefused
from gateway.jobs.callback_policy import AllowedOrigin, CallbackPolicy
from gateway.jobs.callback_sender import CallbackSender
from gateway.jobs.callback_signature import sign, verify
from tests.support.callback_receiver import CallbackReceiver

SECRET = b"test-callback-secret-3f9a1c"


class FakeDns:
    """``name -> addresses``; a later answer can differ (DNS rebinding)."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError("no such host")
        return self.answers[host]


@pytest.mark.parametrize(
    "entry",
    [
        "ftp://x.example",
        "https://x.example/path",
        "https://u:p@x.example",
        "https://",
        "https://a.*.example",
        "https://x.example:99999",
        "http://0x7f.1",
        "http://[fe80::1%25eth0]",
    ],
)
def test_bad_allow_list_entries_are_refused_at_start(entry: str) -> None:
    with pytest.raises(ValueError, match="callback allow-list entry"):
        AllowedOrigin.parse(entry)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://hooks.example.com/done?job=1", None),
        ("https://HOOKS.example.com./done", None),
        ("https://a.b.example.org:8443/x", None),
        ("http://127.0.0.1:9000/hook", None),
        ("http://hooks.example.com/done", "not on this gateway's callback allow-list"),  # scheme
        ("https://hooks.example.com:444/done", "not on this gateway's callback allow-list"),  # port
        ("https://evil.example.com/done", "not on this gateway's callback allow-list"),
        (
            "https://example.org:8443/x",
            "not on this gateway's callback allow-list",
        ),  # the wildcard's apex
        ("https://hooks.example.com.evil.net/", "not on this gateway's callback allow-list"),
        ("http://127.0.0.1:9001/hook", "not on this gateway's callback allow-list"),
        # 127.0.0.1 in the notations every resolver reads (inet_aton): refused, whatever the allow-list says
        ("http://2130706433:9000/", "non-standard notation"),
        ("http://0x7f000001:9000/", "non-standard notation"),
        ("http://0177.0.0.1:9000/", "non-standard notation"),
        ("http://127.1:9000/", "non-standard notation"),
        ("http://0x7f.0.0.1:9000/", "non-standard notation"),
        ("http://[fe80::1%25eth0]:9000/", "zone id"),
        ("http://[::ffff:127.0.0.1]:9000/", "not on this gateway's callback allow-list"),
        ("https://user:pw@hooks.example.com/", "credentials"),
        ("file:///etc/passwd", "http or https"),
        ("https://hooks.example.com/a b", "spaces or control"),
        ("https://hooks.example.com/" + "a" * 2100, "at most 2048"),
    ],
)
def test_urls_are_checked_against_the_allow_list(url: str, reason: str | None) -> None:
    policy = CallbackPolicy(
        ["https://hooks.example.com", "https://*.example.org:8443", "http://127.0.0.1:9000"]
    )
    if reason is None:
        assert policy.check_url(url).url == url
    else:
        with pytest.raises(CallbackRefused, match=reason) as refused:
            policy.check_url(url)
        assert refused.value.field == "callback_url"


def test_callbacks_are_off_without_an_allow_list() -> None:
    with pytest.raises(CallbackRefused, match="not enabled"):
        CallbackPolicy([]).check_url("https://hooks.example.com/")


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.10", "private"),
        ("169.254.169.254", "link-local"),
        ("100.64.0.1", "not a public address"),
        ("::1", "loopback"),
        ("fe80::1%eth0", "link-local"),
        ("::ffff:127.0.0.1", "loopback"),
        ("fd00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        # IPv6 forms that lead to an IPv4 address: 6to4, NAT64 (well-known and local-use), IPv4-compatible,
        # Teredo (client 127.0.0.1, stored inverted), mapped in long form
        ("2002:7f00:1::", "loopback"),
        ("2002:a9fe:a9fe::1", "link-local"),
        ("64:ff9b::7f00:1", "loopback"),
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b:1::a9fe:a9fe", "link-local"),
        ("::127.0.0.1", "loopback"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),
        ("0:0:0:0:0:ffff:a9fe:a9fe", "link-local"),
    ],
)
async def test_names_resolving_to_private_addresses_are_refused(address: str, kind: str) -> None:
    dns = FakeDns({"hooks.example.com": ["93.184.216.34", address]})
    policy = CallbackPolicy(["https://hooks.example.com"], resolver=dns)
    with pytest.raises(CallbackRefused, match=f"resolves to .*{kind}"):
        await policy.addresses(policy.check_url("https://hooks.example.com/done"))


async def test_public_addresses_in_ipv6_forms_pass() -> None:
    # The embedded-IPv4 checks refuse what leads somewhere private, not every such form.
    dns = FakeDns(
        {"hooks.example.com": ["2002:5db8:d822::1", "2606:2800:220:1:248:1893:25c8:1946"]}
    )
    policy = CallbackPolicy(["https://hooks.example.com"], resolver=dns)
    assert len(await policy.addresses(policy.check_url("https://hooks.example.com/done"))) == 2


async def test_private_addresses_the_operator_allows() -> None:
    dns = FakeDns({"hooks.internal": ["10.20.1.5"], "public.example.com": ["93.184.216.34"]})
    policy = CallbackPolicy(
        ["http://hooks.internal:8080", "https://public.example.com", "http://10.0.0.7"],
        ["10.20.0.0/16"],
        resolver=dns,
    )
    assert [
        str(a) for a in await policy.addresses(policy.check_url("http://hooks.internal:8080/x"))
    ] == ["10.20.1.5"]
    assert [
        str(a) for a in await policy.addresses(policy.check_url("https://public.example.com/"))
    ] == ["93.184.216.34"]
    literal = await policy.addresses(policy.check_url("http://10.0.0.7/x"))
    assert [str(a) for a in literal] == ["10.0.0.7"] and "10.0.0.7" not in dns.asked, (
        "a literal is not resolved"
    )
    with pytest.raises(CallbackRefused, match="does not resolve"):
        await CallbackPolicy(["https://nowhere.example"], resolver=dns).addresses(
            CallbackPolicy(["https://nowhere.example"]).check_url("https://nowhere.example/")
        )


def test_the_signature_is_what_the_docs_say() -> None:
    body = b'{"type":"image.generation.job.succeeded"}'
    header = sign(SECRET, body, 1767225600)
    expected = hmac.new(SECRET, b"1767225600." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1767225600,v1={expected}"
    assert verify(SECRET, header, body, now=1767225700)
    assert not verify(SECRET, header, body + b" ", now=1767225700), "the body is signed"
    assert not verify(b"another-secret", header, body, now=1767225700)
    assert not verify(SECRET, header.replace("t=1767225600", "t=1767225601"), body, now=1767225700)
    assert not verify(SECRET, header, body, now=1767225600 + 301), "an old signature is a replay"
    assert not verify(SECRET, "garbage", body)


@pytest.fixture
def receiver() -> Iterator[CallbackReceiver]:
    server = CallbackReceiver(SECRET).start()
    yield server
    server.stop()


async def test_delivery_to_a_real_server(receiver: CallbackReceiver) -> None:
    # A name the operator allow-listed, resolving to a private address it allowed: the request goes to
    # the checked address and carries the name as Host.
    dns = FakeDns({"hooks.test": ["127.0.0.1"]})
    policy = CallbackPolicy([f"http://hooks.test:{receiver.port}"], ["127.0.0.0/8"], resolver=dns)
    sender = CallbackSender(policy, SECRET, timeout_s=2.0)
    body = sender.body({"type": "image.generation.job.succeeded", "data": {"id": "imgjob_x"}})
    try:
        result = await sender.send(f"http://hooks.test:{receiver.port}/done?x=1", body, "imgjob_x")
        assert result.delivered and not result.error
        got = receiver.wait_for(1)[0]
        assert (
            got.verified and got.body == body and json.loads(got.body)["data"]["id"] == "imgjob_x"
        )
        assert got.path == "/done?x=1" and got.headers["host"] == f"hooks.test:{receiver.port}"
        assert (
            got.headers["gateway-job-id"] == "imgjob_x"
            and got.headers["content-type"] == "application/json"
        )

        for status, retry in ((503, True), (429, True), (404, False), (302, False)):
            receiver.answers.append(status)
            result = await sender.send(f"http://hooks.test:{receiver.port}/done", body, "imgjob_x")
            assert not result.delivered and result.retry is retry and str(status) in result.error
        assert "redirects are not followed" in result.error
        assert len(receiver.wait_for(5)) == 5, "the redirect's target was never asked"

        receiver.delay_s = 3.0
        slow = await sender.send(f"http://hooks.test:{receiver.port}/done", body, "imgjob_x")
        assert not slow.delivered and slow.retry and "no answer within 2 s" in slow.error

        dns.answers["hooks.test"] = [
            "93.184.216.34",
            "127.0.0.2",
        ]  # the name now also points elsewhere
        public_only = CallbackPolicy([f"http://hooks.test:{receiver.port}"], resolver=dns)
        refused = await CallbackSender(public_only, SECRET, 2.0).send(
            f"http://hooks.test:{receiver.port}/done", body, "imgjob_x"
        )
        assert not refused.delivered and not refused.retry and "loopback" in refused.error
        assert (
            sender.backoff_s(1, 2.0) == 2.0
            and sender.backoff_s(3, 2.0) == 8.0
            and sender.backoff_s(30, 2.0) == 300
        )
    finally:
        await sender.close()


def test_the_readme_receiver_snippet_verifies_real_signatures() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### Generation jobs\n", 1)[1].split("\n### ", 1)[0]
    snippet = next(
        code
        for code in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
        if "def verify" in code
    )
    namespace: dict[str, object] = {}
    exec(snippet, namespace)  # the receiver's code, as documented
    readme_verify = namespace["verify"]
    body = b'{"type":"image.generation.job.failed"}'
    header = sign(SECRET, body, int(time.time()))
    assert readme_verify(SECRET, header, body) is True  # type: ignore[operator]
    assert readme_verify(SECRET, header, body[:-1]) is False  # type: ignore[operator]
    stale = sign(SECRET, body, int(time.time()) - 600)
    assert readme_verify(SECRET, stale, body) is False  # type: ignore[operator]
