#!/usr/bin/env bash
# Device call 3 on the lent H200 (observe-only): resume the resnet50 study, bert-base study,
# resnet50 characterization sweep. Studies travel in .gpu/studies (carried) and come back as a tarball.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
S=.gpu/studies
python3 -m tuner run --model bert-base --device cuda:0 --max-latency 20ms --trials 16 --window 5 --seed 0 --out $S 2>&1 | tail -12
python3 -m tuner export --model bert-base --device cuda:0 --max-latency 20ms -o $S/h200/bert-base/best.yaml --out $S
python3 -m tuner run --model resnet50 --device cuda:0 --max-latency 20ms --trials 8 --window 5 --seed 1 --out $S 2>&1 | tail -3
python3 -m tuner export --model resnet50 --device cuda:0 --max-latency 20ms -o $S/h200/resnet50/best.yaml --out $S
python3 -m tuner sweep --model resnet50 --device cuda:0 --batch-sizes 1,8,32,128,512 --max-latency 20ms --window 4 --out $S 2>&1 | tail -20
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
tar czf $OUT/studies.tgz -C $S .
