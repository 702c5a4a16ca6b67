#!/usr/bin/env bash
# Device call 5 on the lent H200 (observe-only, issue 11): op-class microbenchmarks, then the
# five zoo models' energy per query at batch 8, 64, 256 (fp16, channels_last). No clock, power
# limit or mode is changed; nvidia-smi reads the card's state before and after.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/opclass_microbench.py --out $OUT 2>&1 | tee $OUT/microbench.log | tail -40
python3 benchmarks/zoo_energy_sweep.py --out $OUT --window 4 2>&1 | tee $OUT/sweep.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
