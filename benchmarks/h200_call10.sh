#!/usr/bin/env bash
# Device call 10 on the lent H200 (observe-only, issue 11): host launch cost per eager layer at fp16 and at
# fp32, on one host, so that the ratio between the two does not mix two machines' speeds. Nothing is changed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
for p in fp16 fp32; do
  python3 benchmarks/launch_microbench.py --out $OUT --precision $p 2>&1 | tee $OUT/launch-$p.log
done
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
