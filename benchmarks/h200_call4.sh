#!/usr/bin/env bash
# Device call 4 on the lent H200 (observe-only): where the LoadGen+metering overhead comes from.
# The energy counter alone (no sampled-power thread), polled every 5 ms and every 20 ms.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/gpu_measurement.py --out $OUT/measure --window 10 --repeats 4 --batch-sizes 128 --poll-ms 5,20 --no-sampled 2>&1 | grep -v "^bs"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
