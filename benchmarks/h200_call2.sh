#!/usr/bin/env bash
# Device call 2 on the lent H200 (observe-only): overhead re-check, resnet50 study, export.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/gpu_measurement.py --out $OUT/measure --window 10 --repeats 5 --batch-sizes 128 2>&1 | tail -3
S=/tmp/studies
python3 -m tuner run --model resnet50 --device cuda:0 --max-latency 20ms --trials 16 --window 5 --seed 0 --out $S 2>&1 | tail -25
python3 -m tuner export --model resnet50 --device cuda:0 --max-latency 20ms -o $S/h200/resnet50/best.yaml --out $S
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
tar czf $OUT/studies.tgz -C $S .
