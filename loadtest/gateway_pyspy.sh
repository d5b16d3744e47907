#!/bin/bash
# A sampled profile of one gateway process under the gateway-profile load (py-spy from PyPI).
# Run from the repository root: loadtest/gateway_pyspy.sh OUT (py-spy on PATH: pip install py-spy)
set -eu
out=${1:?output folder}
mkdir -p "$out"
(PYTHONPATH=$PWD timeout 300 .venv/bin/python -m inferctl bench gateway-profile --no-profile --duration 40 > "$out/pyspy-load.txt" 2>&1 &)
pid=
for _ in $(seq 1 60); do
  pid=$(pgrep -f "python -m gateway --host 127.0.0.1" | head -1 || true)
  [ -n "$pid" ] && break
  sleep 1
done
[ -n "$pid" ] || { echo "no gateway process started within 60 s; see $out/pyspy-load.txt" >&2; exit 1; }
sleep 12  # past the benchmark's warm-up
py-spy record -p "$pid" -d 20 -r 250 -f raw -o "$out/pyspy-collapsed.txt" --nonblocking
