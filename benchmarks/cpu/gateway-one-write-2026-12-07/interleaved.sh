#!/bin/bash
# Interleaved: the tree before the one-write change (6700a73) and after (HEAD).
for i in 1 2 3 4; do
  for side in before after; do
    if [ $side = before ]; then dir=/tmp/ab-old; else dir=/work/main; fi
    echo "== $side run $i $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && PYTHONPATH=$dir timeout 600 .venv/bin/python -m inferctl bench gateway-profile --no-profile --duration 15 2>&1 | grep -E "admitted|refused")
  done
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
