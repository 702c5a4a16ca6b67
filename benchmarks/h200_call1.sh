#!/usr/bin/env bash
# Device call 1 on the lent H200 (observe-only): install carried wheels, smoke-test, measurement quality.
# Exact command used: see benchmarks/results/measurement.md.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode --format=csv | tee $OUT/nvidia-smi-before.csv
python3 -m tuner devices
python3 -m tuner measure --model resnet50 --device cuda:0 --batch-size 8 --set precision=bf16 --window 3 || echo SMOKE-FAILED
python3 -m tuner measure --model bert-base --device cuda:0 --batch-size 8 --set precision=fp16 --window 3 || echo SMOKE-FAILED
python3 benchmarks/gpu_measurement.py --out $OUT/measure --window 10 --repeats 5 2>&1 | tee $OUT/measure.log
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode --format=csv | tee $OUT/nvidia-smi-after.csv
