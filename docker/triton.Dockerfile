# syntax=docker/dockerfile:1
# The Triton image (k8s: triton-platform-triton). Build from the repository root:
#   docker build -f docker/triton.Dockerfile -t triton-platform-triton:0.1.0 .
# NGC's Triton 24.10 (Triton 2.51.0, the version of the embedded server the tests run) with its
# native TensorRT, ONNX Runtime and PyTorch backends, plus what the platform's Python models import
# (NumPy, Pillow, tokenizers, torch), installed into the image's own Python 3.10: the interpreter
# the Python backend's stub is built for. Why not a packed environment per model
# (EXECUTION_ENV_PATH): it would tie every model config to a deployment path and need conda-pack;
# one image serves the same repository the embedded server serves, unchanged.
FROM nvcr.io/nvidia/tritonserver:24.10-py3

# Exact versions resolved for CPython 3.10 / manylinux (docker/triton-requirements.lock, written by
# `./run lock-triton`); --no-deps: nothing outside the lock is installed, and `pip check` proves the
# set complete.
COPY docker/triton-requirements.lock /tmp/triton-requirements.lock
RUN python3 -m pip install --no-cache-dir --no-deps --requirement /tmp/triton-requirements.lock \
    && python3 -m pip check \
    && rm /tmp/triton-requirements.lock

# The pod's readiness probe: every served model READY and answering one synthetic inference
# (standard library only; k8s/base/triton.yaml runs it).
COPY serving/readiness.py /opt/triton-platform/model_readiness.py

# A fixed high uid (the k8s manifests run it as 10001); the model repository is mounted read-only.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin triton-platform
USER 10001
EXPOSE 8000 8001 8002
# Liveness: Triton's own /v2/health/live (the server process answers; model readiness is the pod's
# readiness probe above). The image's Python 3.10 rather than curl, whose presence NGC does not promise.
# The start period covers loading the repository's models.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/live', timeout=4)"]
CMD ["tritonserver", "--model-repository=/models", "--model-control-mode=explicit", "--load-model=*", "--strict-readiness=true"]
