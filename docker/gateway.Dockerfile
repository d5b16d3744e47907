# syntax=docker/dockerfile:1
# The gateway image (k8s: triton-platform-gateway). Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t triton-platform-gateway:0.1.0 .
# Two stages: the first installs the gateway and its dependencies, at exactly the versions of
# requirements.lock, into a virtual environment; the second is the same slim Python with only that
# environment copied in (no pip cache, no compilers, no source tree), run as a non-root user.

# Python 3.11: the version pyproject.toml requires and requirements.lock was resolved for.
FROM python:3.11.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/venv
# Dependencies first (a layer that changes only with the lock), then the gateway's own code.
COPY requirements.lock pyproject.toml README.md ./
COPY gateway ./gateway
COPY serving ./serving
# The gateway extra plus the base dependencies, every version fixed by the lock (`--constraint`:
# pip fails rather than pick a version the lock does not name); `pip check` refuses a broken set.
RUN /opt/venv/bin/pip install --no-cache-dir --constraint requirements.lock ".[gateway]" \
    && /opt/venv/bin/pip check

FROM python:3.11.11-slim-bookworm
# A fixed high uid (the k8s manifests run it as 10001), no login shell, no home.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin gateway
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/gateway
USER 10001
# HTTP API (and /metrics) on 8080, the KServe v2 gRPC entry on 8081 (GATEWAY_GRPC_PORT).
EXPOSE 8080 8081
# Liveness: /healthz answers while the process serves (it does not ask Triton; readiness, /readyz, is
# the orchestrator's business). Python's own urllib: the slim image has no curl. The gateway refuses
# to start without real secrets (GATEWAY_ADMIN_TOKEN etc., see README), so an unconfigured container
# exits instead of turning unhealthy.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
CMD ["python", "-m", "gateway", "--host", "0.0.0.0", "--port", "8080"]
