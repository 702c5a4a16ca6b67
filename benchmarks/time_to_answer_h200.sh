#!/usr/bin/env bash
# Time to an answer on a lent H200, observe-only (benchmarks/results/time-to-answer-h200.md): `tune run` as a user
# types it, timed from the command, for resnet50 Offline 50 ms and bert-base Offline 20 ms and resnet50 Server
# 3000 q/s under 10 ms, with the default sampler (no --trials: it stops by itself, at most 40) and Optuna's TPE
# (30 trials Offline, 12 Server) (benchmarks/time_to_answer_h200.py).
# Nothing on the card is set. Run from a copy of the repository holding .whl/ (optuna, pydantic, loadgen... as
# wheels): SAMPLERS=auto FIRST=--first-build REMEASURE=--remeasure BUDGET=480 bash benchmarks/time_to_answer_h200.sh
# RUNS=resnet50-offline:auto,bert-offline:tpe runs those case:sampler pairs in that order instead of CASES x SAMPLERS;
# REFERENCE=resnet50-offline,bert-offline measures each case's whole-space optimum again after them (same card).
# REPEATS=3 runs the list three times, round after round (default and TPE alternate; round k uses --seed k), and
# prints the medians; vit-offline is a user's py: model (benchmarks/models/vit_b16.py, torchvision needed).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 -c "import torch, optuna, mlperf_loadgen; print('torch', torch.__version__, 'optuna', optuna.__version__)"
python3 benchmarks/time_to_answer_h200.py --cases "${CASES:-resnet50-offline,bert-offline,resnet50-server}" \
  --samplers "${SAMPLERS:-auto,tpe}" --runs "${RUNS:-}" ${FIRST:-} ${REMEASURE:-} --reference "${REFERENCE:-}" \
  --repeats "${REPEATS:-1}" \
  --budget "${BUDGET:-inf}" --work /tmp/tta \
  --out $OUT/time-to-answer.json 2>&1 \
  | tee $OUT/call.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
tar czf $OUT/studies.tgz -C /tmp/tta --exclude=loadgen .
echo "call seconds: $SECONDS"
