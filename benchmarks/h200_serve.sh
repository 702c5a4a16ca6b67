#!/usr/bin/env bash
# Device call on the lent H200 (observe-only): Server and SingleStream windows through real LoadGen.
# Run from a copy of the repository with the carried wheels in .whl/ (benchmarks/results/serve-h200.md).
# Nothing is written to the GPU: no --allow-clock-changes, so clocks and power limit are pinned and read only.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-before.csv
S=$OUT/studies
python3 -m tuner run --model resnet50 --device cuda:0 --scenario server --target-qps 2000 --max-latency 20ms \
  --knobs precision --batch-sizes 8,32,64 --trials 5 --sampler random --seed 0 --window 3 --out $S --json \
  > $OUT/server-run.json; echo "server run rc=$?"
python3 -m tuner run --model resnet50 --device cuda:0 --scenario singlestream --max-latency 10ms \
  --knobs precision,channels_last --trials 3 --sampler random --seed 0 --window 3 --out $S --json \
  > $OUT/singlestream-run.json; echo "singlestream run rc=$?"
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-after.csv
cd $S && tar czf $OUT/studies.tgz . && ls -R | head -40
