#!/usr/bin/env bash
# Device call on the lent H200 (observe-only): Server batches of the size that arrived against the old padded
# batches (benchmarks/serve_batching_h200.py), then `tune plan` on cuda:0 over rates spanning the card's range.
# Run from a copy of the branch holding .whl/ (loadgen, pydantic, optuna and their needs as wheels):
#   bash benchmarks/h200_serve_batching.sh        (results: benchmarks/results/serve-batching-h200.md)
# Nothing is written to the GPU: no --allow-clock-changes, so clocks and power limit are read only.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi.csv
python3 benchmarks/serve_batching_h200.py --out $OUT/serve-batching.json --window ${WINDOW:-5} \
  --budget ${BUDGET:-300} --modes ${MODES:-before,after,arrived-gc} 2>&1 | tee $OUT/serve-batching.log
echo "measured at call second $SECONDS"
timeout ${PLAN_S:-170} python3 -m tuner plan --model resnet50 --device cuda:0 --max-latency 20ms \
  --rates 500,4000,10000 --knobs precision,graph --batch-sizes 8,32,128 --trials 4 --refine 0 --window 2 \
  --sampler random --seed 0 --out /tmp/plan --output $OUT/policy-h200.yaml --json > $OUT/plan.json 2> $OUT/plan.log
echo "plan rc=$? at call second $SECONDS"; tail -5 $OUT/plan.log
nvidia-smi --query-gpu=$Q --format=csv,noheader >> $OUT/nvidia-smi.csv
cat $OUT/nvidia-smi.csv
