#!/usr/bin/env bash
# Device call 6 on the lent H200 (observe-only, issue 11): host launch cost per layer of each zoo
# model's own layers, called alone; graph-replayed small kernels per op class. Nothing is changed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/launch_microbench.py --out $OUT 2>&1 | tee $OUT/launch.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
