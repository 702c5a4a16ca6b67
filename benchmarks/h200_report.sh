#!/usr/bin/env bash
# Device call on the lent H200 (observe-only): `tune report` of resnet50 and bert-base over precision,
# CUDA graphs and batch size. Run from a copy of the repository with the carried wheels in .whl/
# (studies/h200-report/README.md). No --allow-clock-changes: clocks and power limit are read only.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-before.csv
start=$(date +%s)
timeout 290 python3 -m tuner report --model resnet50 --model bert-base --device cuda:0 \
  --knobs precision,graph --batch-sizes 1,32,256 --window 2 --min-window 1 --out $OUT/report \
  2>&1 | tee $OUT/report.log; echo "report rc=${PIPESTATUS[0]} wall=$(( $(date +%s) - start ))s" | tee -a $OUT/report.log
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-after.csv
tar czf $OUT/report.tgz -C $OUT report && rm -rf $OUT/report
