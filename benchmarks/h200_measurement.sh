#!/usr/bin/env bash
# Measurement quality on a lent H200, observe-only (benchmarks/results/measurement.md): repeatability, meter agreement
# and the throughput cost of LoadGen + metering, then that cost as a trial runs (energy counter polled every 5 and
# 20 ms, no sampled-power thread). Nothing on the card is set; nvidia-smi reads its state before and after.
# Run from a copy of the repository holding .whl/ (wheels the machine's image lacks): bash benchmarks/h200_measurement.sh
# The committed figures came from three device calls (2026-11-29) running these steps one by one; their per-call
# scripts (h200_call1.sh, h200_call2.sh, h200_call4.sh) are in git history.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 -m tuner devices
python3 -m tuner measure --model resnet50 --device cuda:0 --batch-size 8 --set precision=bf16 --window 3 || echo SMOKE-FAILED
python3 benchmarks/gpu_measurement.py --out $OUT/measure --window 10 --repeats 5 2>&1 | tee $OUT/measure.log
python3 benchmarks/gpu_measurement.py --out $OUT/measure-128 --window 10 --repeats 5 --batch-sizes 128 2>&1 | tail -3
python3 benchmarks/gpu_measurement.py --out $OUT/measure-poll --window 10 --repeats 4 --batch-sizes 128 --poll-ms 5,20 \
  --no-sampled 2>&1 | grep -v "^bs"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
