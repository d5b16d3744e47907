"""Fault 6 - security checks, and oversized bodies refused before they are read whole.

- Every route in the live OpenAPI document that is not public answers 401/403 with no credential,
  a wrong key, a revoked key, a rotated-away key, a JWT signed with another secret, an expired JWT;
  admin routes also refuse a valid client key.
- The SQLite key store (database, WAL and shm files) holds no plaintext key, only SHA-256 hashes.
- Triton's and the gateway's listening sockets are bound to 127.0.0.1 only.
- The gateway's log (debug level) and Triton's log never contain a key, token or secret.
- A declared Content-Length over the limit gets 413 after a few bytes; a chunked body gets 413 once
  it passes the limit, before the client has finished sending.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import select
import socket
import sqlite3
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jwt
import psutil
import pytest

from gateway.app import PUBLIC_PATHS, PUBLIC_PREFIXES
from tests.support.gateway_procs import (
    ADMIN_TOKEN,
    METRICS_HEADERS,
    METRICS_TOKEN,
    create_key,
    tiny_request,
)

pytestmark = pytest.mark.integration

JWT_SECRET = "rel-jwt-secret-0b8f3c2a9d4e7f61-5a2c"  # 32+ bytes, as RFC 7518 asks for HS256
LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def sec_gateway(rel_triton, gateways):  # type: ignore[no-untyped-def]
    return gateways(
        rel_triton.http_url, max_body_bytes=LIMIT, jwt_secret=JWT_SECRET, log_level="debug"
    )


def _operations(gateway) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    spec = httpx.get(gateway.url + "/openapi.json").json()
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
        and not (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES))
    ]


def _fill(path: str) -> str:
    return (
        path.replace("{name}", "tiny_linear")
        .replace("{key_id}", "000000000000")
        .replace("{model}", "tiny_linear")
    )


def test_no_route_serves_without_valid_credentials(sec_gateway) -> None:  # type: ignore[no-untyped-def]
    good, created = create_key(sec_gateway)
    revoked, revoked_doc = create_key(sec_gateway, name="to-revoke")
    assert (
        httpx.delete(
            f"{sec_gateway.url}/admin/keys/{revoked_doc['key_id']}",
            headers={"X-Admin-Token": ADMIN_TOKEN},
        ).status_code
        == 200
    )
    rotated, rotated_doc = create_key(sec_gateway, name="to-rotate")
    assert (
        httpx.post(
            f"{sec_gateway.url}/admin/keys/{rotated_doc['key_id']}/rotate",
            headers={"X-Admin-Token": ADMIN_TOKEN},
        ).status_code
        == 200
    )
    now = int(time.time())
    forged = jwt.encode(
        {"sub": "mallory", "exp": now + 600, "models": "*"},
        "not-the-secret-but-long-enough-for-hs256",
        algorithm="HS256",
    )
    expired = jwt.encode(
        {"sub": "alice", "exp": now - 600, "models": "*"}, JWT_SECRET, algorithm="HS256"
    )
    none_alg = jwt.encode(
        {"sub": "mallory", "exp": now + 600, "models": "*"}, None, algorithm="none"
    )
    wrong_key = str(created["api_key"])[:-4] + "AAAA"
    bad_credentials = {
        "none": {},
        "wrong key": {"Authorization": f"Bearer {wrong_key}"},
        "wrong X-API-Key": {"X-API-Key": wrong_key},
        "revoked key": revoked,
        "rotated-away key": rotated,
        "forged JWT": {"Authorization": f"Bearer {forged}"},
        "expired JWT": {"Authorization": f"Bearer {expired}"},
        "alg=none JWT": {"Authorization": f"Bearer {none_alg}"},
        "garbage": {"Authorization": "Bearer \x01garbage"},
        "wrong admin token": {"X-Admin-Token": ADMIN_TOKEN + "x"},
    }
    operations = _operations(sec_gateway)
    checked = 0
    leaks: list[str] = []
    with httpx.Client(base_url=sec_gateway.url, timeout=10) as client:
        for method, path in operations:
            cases = dict(bad_credentials)
            if path.startswith("/admin/"):
                cases["client key on admin route"] = good
            for label, headers in cases.items():
                try:
                    response = client.request(method, _fill(path), headers=headers, json={})
                except (
                    httpx.LocalProtocolError
                ):  # httpx refuses to send the control character itself
                    continue
                checked += 1
                # a control character in a header is refused by the HTTP parser itself (400)
                allowed = (400, 401, 403) if label == "garbage" else (401, 403)
                if response.status_code not in allowed:
                    leaks.append(f"{method} {path} with {label} -> {response.status_code}")
    print(
        f"\n[security] {len(operations)} protected operations x credentials: {checked} requests, "
        f"{len(leaks)} let in"
    )
    assert operations and not leaks, "\n".join(leaks)


def test_keys_are_hashed_at_rest(sec_gateway) -> None:  # type: ignore[no-untyped-def]
    keys = [str(create_key(sec_gateway, name=f"k{i}")[1]["api_key"]) for i in range(5)]
    key_id = keys[0].split("_")[1]
    rotated = httpx.post(
        f"{sec_gateway.url}/admin/keys/{key_id}/rotate", headers={"X-Admin-Token": ADMIN_TOKEN}
    ).json()
    keys.append(str(rotated["api_key"]))
    db = sec_gateway.env["GATEWAY_KEYS_DB"]
    files = [f for f in (db, db + "-wal", db + "-shm") if os.path.exists(f)]
    blob = b"".join(Path(f).read_bytes() for f in files)
    # gk_<id>_<secret>, and the secret itself may hold "_": split off the first two parts only.
    secrets = [k.encode() for k in keys] + [k.split("_", 2)[2].encode() for k in keys]
    found = [s for s in secrets if s in blob]
    with sqlite3.connect(db) as conn:
        hashes = {row[0] for row in conn.execute("SELECT key_hash FROM api_keys")}
    print(
        f"\n[security] key store {[f.rsplit('/', 1)[1] for f in files]}: {len(blob)} bytes, "
        f"{len(keys)} keys, plaintext found={len(found)}"
    )
    assert not found, "a plaintext key is stored"
    assert {hashlib.sha256(k.encode()).hexdigest() for k in keys[1:]} <= hashes


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC binds ::ffff:127.0.0.1
    return bool((mapped or address).is_loopback)


def _listening(pid: int) -> list[tuple[str, int]]:
    process = psutil.Process(pid)
    sockets = []
    for proc in [process, *process.children(recursive=True)]:
        sockets += [
            (c.laddr.ip, c.laddr.port)
            for c in proc.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
    return sockets


def test_triton_and_gateway_listen_on_loopback_only(  # type: ignore[no-untyped-def]
    rel_triton, sec_gateway
) -> None:
    triton_sockets = _listening(rel_triton.pid)
    gateway_sockets = _listening(sec_gateway.process.pid)
    external = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    reachable = []
    for address in external:
        for _, port in triton_sockets:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((address, port)) == 0:
                    reachable.append(f"{address}:{port}")
    print(
        f"\n[security] Triton listens on {sorted(triton_sockets)}; gateway on {gateway_sockets}; "
        f"Triton ports tried on {external or 'no non-loopback address'}: reachable={reachable}"
    )
    assert {p for _, p in triton_sockets} >= {
        rel_triton.ports.http,
        rel_triton.ports.grpc,
        rel_triton.ports.metrics,
    }
    assert all(_loopback(ip) for ip, _ in triton_sockets + gateway_sockets)
    assert not reachable


def test_secrets_never_appear_in_logs(rel_triton, sec_gateway) -> None:  # type: ignore[no-untyped-def]
    headers, created = create_key(sec_gateway, name="log-check")
    key = str(created["api_key"])
    token = jwt.encode(
        {"sub": "carol", "exp": int(time.time()) + 600, "models": "*"},
        JWT_SECRET,
        algorithm="HS256",
    )
    wrong = key[:-6] + "ZZZZZZ"
    url = sec_gateway.url + "/v2/models/tiny_linear/infer"
    with httpx.Client(timeout=10) as client:
        statuses = [
            client.post(url, json=tiny_request(), headers=headers).status_code,
            client.post(url, json=tiny_request(), headers={"X-API-Key": key}).status_code,
            client.post(
                url, json=tiny_request(), headers={"Authorization": f"Bearer {token}"}
            ).status_code,
            client.post(
                url, json=tiny_request(), headers={"Authorization": f"Bearer {wrong}"}
            ).status_code,
            client.get(
                sec_gateway.url + "/admin/keys", headers={"X-Admin-Token": ADMIN_TOKEN}
            ).status_code,
            client.get(
                sec_gateway.url + "/admin/keys", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ).status_code,
            client.get(sec_gateway.url + "/v1/stats", headers=headers).status_code,
            client.get(sec_gateway.url + "/metrics").status_code,
            client.get(sec_gateway.url + "/metrics", headers=headers).status_code,
            client.get(sec_gateway.url + "/metrics", headers=METRICS_HEADERS).status_code,
        ]
        metrics = client.get(sec_gateway.url + "/metrics", headers=METRICS_HEADERS).text
    assert statuses == [200, 200, 200, 401, 200, 200, 200, 401, 401, 200], statuses
    time.sleep(0.3)  # let the access log reach the file
    logs = {"gateway": sec_gateway.log(), "triton": rel_triton.log_tail(400), "metrics": metrics}
    secrets = {
        "api key": key,
        "key secret": key.split("_", 2)[2],  # the secret may hold "_"
        "wrong key": wrong,
        "JWT": token,
        "JWT secret": JWT_SECRET,
        "admin token": ADMIN_TOKEN,
        "metrics token": METRICS_TOKEN,
    }
    leaked = [
        f"{what} in {where}"
        for where, text in logs.items()
        for what, value in secrets.items()
        if value in text
    ]
    sizes = {k: len(v) for k, v in logs.items()}
    print(f"\n[security] log sizes {sizes}; secrets checked {list(secrets)}; leaked={leaked}")
    assert not leaked


def _raw_request(gateway, head: str) -> socket.socket:  # type: ignore[no-untyped-def]
    host, port = urlsplit(gateway.url).hostname, urlsplit(gateway.url).port
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(head.encode())
    return sock


def _read_status(sock: socket.socket, timeout_s: float = 5.0) -> str:
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode()


def test_declared_oversized_body_is_413_before_it_is_sent(  # type: ignore[no-untyped-def]
    sec_gateway,
) -> None:
    headers, _ = create_key(sec_gateway)
    declared = 64 * 1024 * 1024
    head = (
        "POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Authorization: {headers['Authorization']}\r\nContent-Length: {declared}\r\n\r\n"
    )
    started = time.monotonic()
    with _raw_request(sec_gateway, head) as sock:
        sock.sendall(b"{" + b" " * 1023)  # 1 KiB of the promised 64 MiB
        status = _read_status(sock)
    print(
        f"\n[limits] declared {declared} bytes, sent 1024: '{status}' after "
        f"{(time.monotonic() - started) * 1000:.1f} ms"
    )
    assert status.split()[1] == "413", status


def test_chunked_oversized_body_is_413_before_it_ends(sec_gateway) -> None:  # type: ignore[no-untyped-def]
    headers, _ = create_key(sec_gateway)
    head = (
        "POST /v2/models/tiny_linear/infer HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
        f"Authorization: {headers['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = 8 * 1024
    sent = 0
    status = ""
    with _raw_request(sec_gateway, head) as sock:
        while sent < 16 * LIMIT:  # never the terminating chunk: the body does not end
            try:
                sock.sendall(f"{chunk:x}\r\n".encode() + b" " * chunk + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += chunk
            if select.select([sock], [], [], 0.02)[0]:
                break
        status = _read_status(sock)
    print(
        f"\n[limits] chunked body, limit {LIMIT}: '{status}' after {sent} bytes sent (never finished)"
    )
    assert status.split()[1] == "413", status
    assert sent < 16 * LIMIT, "the gateway kept reading a body over the limit"
