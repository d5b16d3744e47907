#!/bin/bash
# The gateway's CPU per request, two trees interleaved: `inferctl bench gateway-profile --no-profile`
# on the trees BEFORE and AFTER, ROUNDS times, the order swapped every round (BEFORE first in odd
# rounds). The machine's speed drifts between minutes, so only rounds run side by side are
# compared; and on the 2-core development machine the second run of a pair was 5-16% slower than
# the first whichever tree it was (benchmarks/cpu/gateway-one-write-2026-12-07/), so a fixed order
# would credit that to a tree. Each tree needs its .venv (a link to one is enough).
#
#   git worktree add /tmp/ab-old <commit>
#   loadtest/gateway_cpu_ab.sh /tmp/ab-old "$PWD" 4 > interleaved-1.txt
set -euo pipefail
before=${1:?usage: gateway_cpu_ab.sh BEFORE_TREE AFTER_TREE [ROUNDS] [DURATION_S]}
after=${2:?usage: gateway_cpu_ab.sh BEFORE_TREE AFTER_TREE [ROUNDS] [DURATION_S]}
rounds=${3:-4}
duration=${4:-15}
for i in $(seq 1 "$rounds"); do
  order="before after"
  [ $((i % 2)) -eq 0 ] && order="after before"
  for side in $order; do
    if [ "$side" = before ]; then dir=$before; else dir=$after; fi
    echo "== $side run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd "$dir" && PYTHONPATH=$dir timeout 600 .venv/bin/python -m inferctl bench gateway-profile \
      --no-profile --duration "$duration" 2>&1 | grep -E "admitted|refused")
  done
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
