#!/usr/bin/env bash
# Stable Diffusion parity and speed on one NVIDIA GPU in a fixed time: the served pipeline's code
# (stable_diffusion_torch, FP16, in process) vs diffusers' StableDiffusionPipeline on the SD 1.5
# configuration, randomly initialised (python -m loadtest.diffusion_process; its docstring says what
# is measured). Made for one H200 with PyTorch + CUDA, Python 3.12, numpy 2 and transformers, but no
# diffusers, tritonclient or network.
#
#   loadtest/diffusion_gpu.sh wheels [DIR]      HERE, with pip and network: fill DIR (default
#                                               .whl-diffusion, 4.3 MB) with the packages below,
#                                               diffusers cut by loadtest/_slim_diffusers.py
#   loadtest/diffusion_gpu.sh OUT_DIR [--budget-s S] [--wheels DIR[,DIR...]] [ARGS...]
#                                               THERE: the run, in S seconds (default 120) all told
#
# The run installs diffusers, tritonclient, python-rapidjson and ddsketch, each from the first of the
# DIRs (default .whl-diffusion) that has it, into a private folder (nothing outside it changes; what
# no DIR has must be on the host already), notes the GPU and the package versions in
# OUT_DIR/log.txt, then runs
#   python -m loadtest.diffusion_process --out OUT_DIR --budget-s (S minus the setup so far) ARGS
# under `timeout` (what is left + 15 s): points that would not fit are reported as not run, and bench.json and
# bench.txt are rewritten after every point, so even a stopped run keeps what it measured.
# OUT_DIR gets three flat files: bench.txt (the tables), bench.json (every figure, the machine, the
# setup's seconds) and log.txt (versions, progress, exit status; its end is also printed).
# A dry run on a CPU (this checkout's environment, the tiny checkpoint):
#   loadtest/diffusion_gpu.sh OUT --budget-s 600 --device cpu --preset tiny --sizes 64x64:3,96x96:3 \
#       --concurrency 1,2 --switch 96x96:2
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
WHEELS=(diffusers==0.42.1 tritonclient==2.73.0 python-rapidjson==1.25 ddsketch==3.0.1)

if [ "${1:-}" = wheels ]; then
    dir=${2:-.whl-diffusion}
    mkdir -p "$dir"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$dir" "${WHEELS[@]}"
    # diffusers' 6 MB wheel cut to what the run imports (2.4 MB).
    "$PY" -m loadtest._slim_diffusers "$dir"/diffusers-0.42.1-py3-none-any.whl "$dir"/diffusers-0.42.1-slim.zip
    rm "$dir"/diffusers-0.42.1-py3-none-any.whl
    du -sh "$dir"
    exit 0
fi

out=${1:?usage: loadtest/diffusion_gpu.sh OUT_DIR [--budget-s S] [--wheels DIR[,DIR...]] [ARGS...] (or: wheels [DIR])}
shift
budget=120
wheels=.whl-diffusion
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget-s) budget=$2; shift 2 ;;
        --wheels) wheels=$2; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
mkdir -p "$out"
started=$SECONDS

# Only the packages named above, each once, from the first folder that has it (another run's
# folder may be given too: its other wheels are not installed).
site=${DIFFUSION_SITE:-/tmp/diffusion-site}
rm -rf "$site"
mkdir -p "$site"
found=()
seen=" "
IFS=, read -r -a folders <<< "$wheels"
for dir in "${folders[@]}"; do
    for file in "$dir"/*.whl "$dir"/*.zip; do
        [ -e "$file" ] || continue
        dist=$(basename "$file"); dist=${dist%%-*}; dist=${dist,,}
        case " diffusers tritonclient python_rapidjson ddsketch " in *" $dist "*) ;; *) continue ;; esac
        case "$seen" in *" $dist "*) continue ;; esac
        seen="$seen$dist "
        found+=("$file")
    done
done
for file in "${found[@]}"; do
    case "$file" in
        *.zip) "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$file" "$site" ;;
        *) "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$file" ;;
    esac
done
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error DIFFUSERS_VERBOSITY=error
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
    # Found, not imported (importing torch and diffusers here would spend the budget twice);
    # bench.json records the versions the run imported.
    "$PY" -c 'import importlib.util as u, sys
names = ("torch", "diffusers", "transformers", "tritonclient", "rapidjson", "ddsketch")
print("python", sys.version.split()[0], *(m + (" found" if u.find_spec(m) else " MISSING") for m in names))' 2>&1
    echo "setup took $((SECONDS - started)) s of the ${budget} s budget"
} > "$out/log.txt"

left=$((budget - (SECONDS - started)))
[ "$left" -ge 1 ] || left=1  # a budget spent on the setup still bounds the run (0 would mean no limit)
set +e
timeout --kill-after=5 $((left + 15)) "$PY" -m loadtest.diffusion_process --out "$out" --budget-s "$left" "${args[@]}" \
    >> "$out/log.txt" 2>&1
rc=$?
set -e
echo "loadtest.diffusion_process exited $rc after $((SECONDS - started)) s in all" >> "$out/log.txt"
tail -n 60 "$out/log.txt"
exit $rc
