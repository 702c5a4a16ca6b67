#!/usr/bin/env bash
# The whole observe-only H200 space of one or more models on the lent H200, every configuration in two windows
# (benchmarks/h200_observe_space.py): the data of the recorded board measured:h200 (tuner/devices/virtual/recorded.py).
# Nothing on the card is changed. Run from a copy of the repository holding .whl/ (pydantic, loadgen, optuna... as
# wheels): MODELS="resnet50" bash benchmarks/h200_observe_space.sh (raw windows: benchmarks/results/h200-observe/)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
for m in ${MODELS:-resnet50}; do
  python3 benchmarks/h200_observe_space.py --model $m --out $OUT/observe-$m.json --window ${WINDOW:-1.2} \
    --budget ${BUDGET:-540} 2>&1 | tee $OUT/observe-$m.log | grep -v "^[01] "
done
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
echo "call seconds: $SECONDS"
