#!/usr/bin/env bash
# The H200 twin's calibration sources on a lent H200, observe-only (benchmarks/results/h200-opclass.md, docs/twin.md):
# op-class microbenchmarks (every class), host launch cost per eager layer at fp16 and fp32, the five zoo models'
# energy per query at batch 8, 64, 256 (energy counter read by the meter's polling thread), and CUDA kernel time per
# batch of each zoo model. Nothing on the card is set; nvidia-smi reads its state before and after.
# Run from a copy of the repository holding whl/ (pydantic, which the meter imports): bash benchmarks/h200_twin_calibration.sh
# The committed results came from six device calls (2026-11-29/30), one step each, in benchmarks/results/h200-call5 to
# h200-call10 (call 5: microbenchmarks and a first sweep, 6: launch, 7: kernel profile, 8: the sweep again, 9: layout
# copies and broadcasts, 10: launch at fp16 and fp32); their per-call scripts are in git history. The results are
# copied into scripts/calibration_data/ for scripts/calibrate_twin.py.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 benchmarks/opclass_microbench.py --out $OUT 2>&1 | tee $OUT/microbench.log | tail -40
for p in fp16 fp32; do
  python3 benchmarks/launch_microbench.py --out $OUT --precision $p 2>&1 | tee $OUT/launch-$p.log
done
python3 benchmarks/zoo_energy_sweep.py --out $OUT --window 5 2>&1 | tee $OUT/sweep.log
python3 benchmarks/zoo_kernel_profile.py --out $OUT 2>&1 | tee $OUT/profile.log
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
