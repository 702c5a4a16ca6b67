#!/usr/bin/env bash
# The clocks an observe-only H200 ran (issue 46 item 5): a short `tune run` on cuda:0, then `tune export` in its
# YAML and env forms, and each trial's SM/memory clock mean/min/max as trials.csv records them.
# Nothing on the card is set: the card's settings are read before and after and must be equal.
# Run from a copy of the repository holding .whl/ (optuna, pydantic, loadgen... as wheels):
#   bash benchmarks/h200_observed_clocks.sh     (results: benchmarks/results/h200-observed-clocks/)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,clocks.max.sm,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
W=/tmp/clocks
python3 -m tuner run -m resnet50 -d cuda:0 -l 50ms --trials 6 --seed 1 --out $W 2>&1 | tee $OUT/run.log
python3 -m tuner export -m resnet50 -d cuda:0 --out $W -o $OUT/best.yaml 2>&1 | tee $OUT/export.log
python3 -m tuner export -m resnet50 -d cuda:0 --out $W -f env -o $OUT/best.env 2>&1 | tee -a $OUT/export.log
find $W -name trials.csv -exec cp {} $OUT/trials.csv \;
python3 - <<'PY' | tee $OUT/clocks.txt
import csv, os
rows = list(csv.DictReader(open(os.environ["OUT"] + "/trials.csv")))
cols = [c for c in rows[0] if c.startswith(("sm_mhz", "mem_mhz", "sm_clock"))] if rows else []
print("trial", *cols)
for r in rows:
    print(r.get("number", r.get("trial", "?")), *(r[c] for c in cols))
PY
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv $OUT/best.yaml $OUT/best.env
echo "call seconds: $SECONDS"
