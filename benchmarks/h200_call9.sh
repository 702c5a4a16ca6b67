#!/usr/bin/env bash
# Device call 9 on the lent H200 (observe-only, issue 11): microbenchmarks of the two kernel families the
# call-7 kernel profile found outside the twin's op classes: the layout copies eager attention makes
# (transposed view made contiguous) and squeeze-and-excitation broadcast multiplies. Nothing is changed.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/opclass_microbench.py --out $OUT --classes layout_copy,broadcast 2>&1 | tee $OUT/microbench.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
