#!/usr/bin/env bash
# Device call 8 on the lent H200 (observe-only, issue 11): the five-model energy sweep again with the energy
# counter read from the meter's polling thread (call 5 read it inside the batch loop, which cost 4-5 ms per
# batch). Nothing is changed.
set -uo pipefail
# pydantic (the project meter imports it) travels as wheels in whl/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site
export PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/zoo_energy_sweep.py --out $OUT --window 5 2>&1 | tee $OUT/sweep.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
