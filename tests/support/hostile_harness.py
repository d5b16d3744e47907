"""The hostile suite's harness: sends a case (httpx, a raw socket or the gRPC entry), judges the answer,
and watches the gateway and Triton behind it.

After each input :meth:`Harness.after` checks that Triton is the same process (pid and start time
unchanged), that the gateway is alive, and that memory stays bounded: the peak RSS of the gateway
during the input stays within ``GATEWAY_RSS_BOUND`` of its baseline, and that of each Triton process
(the Python backend stubs included) within ``TRITON_RSS_BOUND`` of its own. Peaks are Linux's VmHWM,
reset after each input (``/proc/<pid>/clear_refs``), so a transient blow-up is seen and charged to
its input. Every ``CHECK_EVERY`` inputs every model answers a good request through the gateway.
"""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
from tritonclient.grpc import service_pb2_grpc

from gateway.protocol.kserve import InferRequest, InputTensor, encode_rest
from gateway.routes.kserve_grpc import GRPC_STATUS
from serving.launcher import TritonServer
from tests.support.gateway_procs import ADMIN_TOKEN, GatewayProcess, create_key
from tests.support.hostile_corpus import GrpcAttempt, Hostile, HttpAttempt, RawAttempt
from tests.support.hostile_images import good_jpeg
from tests.support.hostile_media import image_kserve_body

__all__ = ["CHECK_EVERY", "GATEWAY_RSS_BOUND", "TRITON_RSS_BOUND", "Answer", "Harness", "Tally"]

CHECK_EVERY = 25
GATEWAY_RSS_BOUND = 256 << 20
TRITON_RSS_BOUND = 1 << 30
#: gRPC status -> the HTTP status the gateway's table maps to it (UNIMPLEMENTED: a call not served here)
_GRPC_AS_HTTP: dict[grpc.StatusCode, int] = {
    **{code: status for status, code in sorted(GRPC_STATUS.items(), reverse=True)},
    grpc.StatusCode.UNIMPLEMENTED: 405,
}


@dataclass
class Answer:
    status: int | None
    content_type: str = ""
    text: str = ""

    def document(self) -> dict[str, object] | None:
        try:
            value = json.loads(self.text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


@dataclass
class Tally:
    tried: int = 0
    server_errors: list[str] = field(default_factory=list)
    restarts: int = 0
    failed: list[str] = field(default_factory=list)


def _peak_rss(process: psutil.Process) -> int:
    """The process's peak resident memory since the last reset (VmHWM) where Linux reports it,
    else its current RSS (psutil)."""
    try:
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(process.memory_info().rss)


def _reset_peak(process: psutil.Process) -> None:
    try:
        Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # VmHWM := current RSS
    except OSError:
        pass  # not Linux, or not allowed: peaks then only grow, which is stricter


class Harness:
    """Sends cases through the hostile gateway and watches the processes behind it."""

    def __init__(self, triton: TritonServer, gateway: GatewayProcess, grpc_port: int) -> None:
        self.triton = triton
        self.gateway = gateway
        self.address = ("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))
        # The hostile gateway closes idle connections after 1 s. A client that kept one as long
        # could send on it just as the gateway closes it (a reset, seen once in a full suite): this
        # one drops idle connections after half that.
        self.client = httpx.Client(
            base_url=gateway.url, timeout=60, limits=httpx.Limits(keepalive_expiry=0.5)
        )
        self.grpc_channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        self.grpc_stub = service_pb2_grpc.GRPCInferenceServiceStub(self.grpc_channel)
        self.tally = Tally()
        self.since_check = 0
        assert triton.pid is not None
        self.triton_process = psutil.Process(triton.pid)
        self.triton_started = self.triton_process.create_time()
        assert gateway.process.pid is not None
        self.gateway_process = psutil.Process(gateway.process.pid)
        self.credentials: dict[str, dict[str, str]] = {
            "none": {},
            "admin": {"X-Admin-Token": ADMIN_TOKEN},
        }
        self.credentials["client"], client = create_key(gateway, tier="unlimited", name="hostile")
        self.credentials["other"], _ = create_key(gateway, tier="unlimited", name="other-tenant")
        self.placeholders = {"{other_key_id}": str(client["key_id"])}
        self.cat = good_jpeg()
        self.check_models()  # warm every model before the baselines are taken
        self.baselines = {p.pid: int(p.memory_info().rss) for p in self._watched()}
        for process in self._watched():
            _reset_peak(process)

    def close(self) -> None:
        self.client.close()
        self.grpc_channel.close()

    # -- sending -----------------------------------------------------------------------------

    def send(self, case: Hostile) -> Answer:
        if isinstance(case.attempt, GrpcAttempt):
            return self._send_grpc(case.attempt)
        if isinstance(case.attempt, RawAttempt):
            auth = self.credentials["client"]["Authorization"].encode()
            return self._send_raw(case.attempt.data().replace(b"{auth}", auth))
        return self._send_http(case.attempt)

    def _send_http(self, attempt: HttpAttempt) -> Answer:
        headers = {
            "Accept": "application/problem+json",
            **self.credentials[attempt.credential],
            **attempt.headers,
        }
        content = None
        if attempt.body is not None:
            made = attempt.body()
            content, extra = made if isinstance(made, tuple) else (made, {})
            headers = {"Content-Type": "application/json", **headers, **extra}
        path = attempt.path
        for placeholder, value in self.placeholders.items():
            path = path.replace(placeholder, value)
        files = attempt.files() if attempt.files is not None else None
        try:
            response = self.client.request(
                attempt.method, path, content=content, files=files, headers=headers
            )
        except httpx.TransportError as exc:
            return Answer(None, text=f"{type(exc).__name__}: {exc}")
        return Answer(response.status_code, response.headers.get("content-type", ""), response.text)

    def _send_grpc(self, attempt: GrpcAttempt) -> Answer:
        """One call on the gRPC entry; its status code read as the HTTP status the gateway maps it from."""
        metadata = (
            [("authorization", self.credentials["client"]["Authorization"])]
            if attempt.credential == "client"
            else []
        )
        call = getattr(self.grpc_stub, attempt.method)
        try:
            call(attempt.request(), metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            detail = f"{code.name}: {exc.details()}"  # type: ignore[attr-defined]
            return Answer(_GRPC_AS_HTTP.get(code, 500), "grpc", detail)
        return Answer(200, "grpc", "OK")

    def _send_raw(self, data: bytes) -> Answer:
        """Write ``data`` while reading the answer (a refusal may come before the last byte is sent).

        Reading stops at the end of the first answer, or when the gateway closes the connection."""
        received: list[bytes] = []
        with socket.create_connection(self.address, timeout=30) as sock:

            def read() -> None:
                try:
                    while chunk := sock.recv(1 << 16):
                        received.append(chunk)
                        if _complete(b"".join(received)):
                            return
                except OSError:
                    pass

            reader = threading.Thread(target=read)
            reader.start()
            try:
                sock.sendall(data)
            except OSError:
                pass  # the gateway closed early; its answer is what matters
            reader.join()
        return _parse_http(b"".join(received))

    # -- judging -----------------------------------------------------------------------------

    def judge(self, case: Hostile, answer: Answer) -> list[str]:
        problems: list[str] = []
        if answer.status is None:
            problems.append(f"no answer ({answer.text[:200]})")
            return problems
        if answer.status >= 500:
            self.tally.server_errors.append(f"{case.id} -> {answer.status}: {answer.text[:200]}")
        if answer.status not in case.expect:
            problems.append(
                f"status {answer.status}, expected {sorted(case.expect)}: {answer.text[:300]}"
            )
        if 400 <= answer.status < 500 and answer.content_type == "grpc":
            if case.mentions and not any(
                word.lower() in answer.text.lower() for word in case.mentions
            ):
                problems.append(
                    f"the answer does not name the problem ({case.mentions}): {answer.text[:200]}"
                )
        elif 400 <= answer.status < 500:
            document = answer.document()
            if not answer.content_type.startswith("application/problem+json") or document is None:
                problems.append(
                    f"a {answer.status} that is not a problem document: {answer.text[:200]}"
                )
            elif case.mentions:
                said = " ".join(
                    str(document.get(k, "")) for k in ("detail", "field", "title")
                ).lower()
                if not any(word.lower() in said for word in case.mentions):
                    problems.append(
                        f"the answer does not name the problem ({case.mentions}): {document.get('detail')}"
                    )
        for secret in case.forbid:
            for placeholder, value in self.placeholders.items():
                secret = secret.replace(placeholder, value)
            if secret in answer.text:
                problems.append(f"the answer shows {secret!r}: {answer.text[:300]}")
        return problems

    # -- watching ----------------------------------------------------------------------------

    def _watched(self) -> list[psutil.Process]:
        """The gateway, Triton and Triton's children (the Python backend stubs)."""
        return [
            self.gateway_process,
            self.triton_process,
            *self.triton_process.children(recursive=True),
        ]

    def same_triton(self) -> bool:
        try:
            alive = (
                self.triton_process.is_running()
                and self.triton_process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            alive = False
        return (
            alive
            and self.triton.running()
            and self.triton_process.create_time() == self.triton_started
        )

    def check_models(self) -> list[str]:
        """A good request for every public model, through the gateway; what failed."""
        auth = {**self.credentials["client"], "Accept": "application/problem+json"}
        pixels = InputTensor.from_numpy("input", np.zeros((1, 3, 224, 224), dtype=np.float32))
        body, headers = encode_rest(InferRequest(inputs=(pixels,)))
        image_body, image_headers = image_kserve_body([self.cat])
        checks = [
            (
                "efficientnet_lite0",
                "/v2/models/efficientnet_lite0/infer",
                {"content": body, "headers": {**auth, **headers}},
            ),
            (
                "image_classifier",
                "/v2/models/image_classifier/infer",
                {"content": image_body, "headers": {**auth, **image_headers}},
            ),
            (
                "classify",
                "/v1/classify",
                {"files": [("file", ("cat.jpg", self.cat, "image/jpeg"))], "headers": auth},
            ),
            (
                "text_embedding",
                "/v1/embeddings",
                {"json": {"model": "text_embedding", "input": ["a cat"]}, "headers": auth},
            ),
        ]
        failed = []
        for name, path, kwargs in checks:
            try:
                response = self.client.post(path, **kwargs)  # type: ignore[arg-type]
                if response.status_code != 200:
                    failed.append(f"{name}: {response.status_code} {response.text[:200]}")
            except httpx.TransportError as exc:
                failed.append(f"{name}: {type(exc).__name__}")
        return failed

    def check_memory(self) -> list[str]:
        """Each watched process's peak since the last check against its baseline; peaks reset after."""
        problems = []
        for process in self._watched():
            try:
                grown = _peak_rss(process) - self.baselines.setdefault(
                    process.pid, int(process.memory_info().rss)
                )
                name = (
                    "the gateway"
                    if process is self.gateway_process
                    else f"Triton's {process.name()} ({process.pid})"
                )
                _reset_peak(process)
            except psutil.NoSuchProcess:
                continue
            bound = GATEWAY_RSS_BOUND if process is self.gateway_process else TRITON_RSS_BOUND
            if grown > bound:
                problems.append(
                    f"{name} peaked {grown >> 20} MiB above its baseline (bound {bound >> 20} MiB)"
                )
        return problems

    def after(self, case: Hostile, force_full: bool = False) -> list[str]:
        """The checks after each input: same Triton, live gateway; models and memory every N."""
        problems = []
        if not self.same_triton():
            self.tally.restarts += 1
            problems.append(
                f"Triton is gone or restarted after {case.id}:\n{self.triton.log_tail(30)}"
            )
            return problems
        if not self.gateway.process.running():
            problems.append(f"the gateway exited after {case.id}:\n{self.gateway.log()[-2000:]}")
            return problems
        problems += self.check_memory()
        self.since_check += 1
        if force_full or self.since_check >= CHECK_EVERY:
            self.since_check = 0
            problems += [f"a good request failed after {case.id}: {p}" for p in self.check_models()]
        return problems


def _complete(raw: bytes) -> bool:
    head, found, rest = raw.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(rest) >= int(value.strip())
    return False


def _parse_http(raw: bytes) -> Answer:
    """The first HTTP response in ``raw`` (status, content type, body by its content-length)."""
    if not raw.startswith(b"HTTP/"):
        return Answer(None, text=f"no HTTP answer ({len(raw)} bytes: {raw[:80]!r})")
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = int(headers.get("content-length", len(rest)))
    return Answer(
        status, headers.get("content-type", ""), rest[:length].decode("utf-8", errors="replace")
    )
