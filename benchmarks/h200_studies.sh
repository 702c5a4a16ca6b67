#!/usr/bin/env bash
# Studies on a lent H200, observe-only: resnet50 and bert-base (16 trials each, p99 <= 20 ms) with their exports, and a
# resnet50 sweep over batch 1-512. Their measurements are the twin's H200 calibration rows
# (scripts/calibration_data/h200-measured.json) and the committed studies/h200/. Nothing on the card is set.
# Run from a copy of the repository holding .whl/: bash benchmarks/h200_studies.sh; the studies come back as studies.tgz.
# The committed rows came from two device calls (2026-11-29; h200_call2.sh and h200_call3.sh in git history), the
# second of which resumed the resnet50 study with 8 more trials at seed 1, as the last run below does.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
S=/tmp/studies
for m in resnet50 bert-base; do
  python3 -m tuner run --model $m --device cuda:0 --max-latency 20ms --trials 16 --window 5 --seed 0 --out $S 2>&1 | tail -12
done
python3 -m tuner run --model resnet50 --device cuda:0 --max-latency 20ms --trials 8 --window 5 --seed 1 --out $S 2>&1 | tail -3
for m in resnet50 bert-base; do
  python3 -m tuner export --model $m --device cuda:0 --max-latency 20ms -o $S/h200/$m/best.yaml --out $S
done
python3 -m tuner sweep --model resnet50 --device cuda:0 --batch-sizes 1,8,32,128,512 --max-latency 20ms --window 4 \
  --out $S 2>&1 | tail -20
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
tar czf $OUT/studies.tgz -C $S .
