#!/usr/bin/env bash
# Device call on the lent H200 (observe-only): `tune apply --dry-run` of the committed real H200 exports
# (studies/h200/resnet50/best.yaml, studies/h200/bert-base/best.yaml) on the card itself. Nothing is set:
# no --allow-clock-changes, so the NVML device opens observe-only and says which knobs it cannot apply and
# what the serving runtime must be given. Run from a copy of the repository holding .whl/ (pydantic, optuna,
# typer... as wheels): bash benchmarks/h200_apply_dry_run.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 COLUMNS=100 TUNE_STATE_DIR=/tmp/tune-state
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-before.csv
for model in resnet50 bert-base; do
  echo "\$ tune apply studies/h200/$model/best.yaml --device cuda:0 --dry-run"
  python3 -m tuner apply studies/h200/$model/best.yaml --device cuda:0 --dry-run; echo "rc=$?"
  python3 -m tuner apply studies/h200/$model/best.yaml --device cuda:0 --dry-run --json > $OUT/apply-dry-run-$model.json
  echo "json rc=$?"
done 2>&1 | tee $OUT/apply-dry-run.log
nvidia-smi --query-gpu=$Q --format=csv | tee $OUT/nvidia-smi-after.csv
echo "call seconds: $SECONDS"
