#!/usr/bin/env bash
# Device call 7 on the lent H200 (observe-only, issue 11): CUDA kernel time per batch of each zoo model
# (batch 8, 64, 256, fp16) and of the launch-bound reference rows, grouped later by the twin's op classes
# (scripts/zoo_kernel_diagnostic.py). No clock, power limit or mode is changed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/zoo_kernel_profile.py --out $OUT 2>&1 | tee $OUT/profile.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
