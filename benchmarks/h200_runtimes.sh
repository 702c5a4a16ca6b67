#!/usr/bin/env bash
# Trial cost on a lent H200, observe-only (benchmarks/results/runtimes.md): overhead, adaptive windows, the graph knob.
# Run from a copy of the repository holding .whl/ (optuna, pydantic, loadgen, typer... as wheels).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
REPO=$PWD
Q="name,driver_version,clocks.sm,clocks.mem,clocks.applications.graphics,power.limit,persistence_mode,compute_mode"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-before.csv
python3 -c "import torch, optuna, mlperf_loadgen; print('torch', torch.__version__, 'optuna', optuna.__version__)"
B="python3 $REPO/benchmarks/h200_runtimes.py"
# 1. LoadGen + metering overhead against the bare loop (resnet50 fp16 channels_last bs128, 10 s windows)
$B overhead --out $OUT/overhead.json --window 10 --repeats 2 2>&1 | grep -v "^$"
# 2. The 30-trial study, exactly as a user types it, in a scratch folder (defaults: adaptive window 2-10 s, 1%)
mkdir -p /tmp/study && cd /tmp/study
start=$(date +%s.%N)
python3 -m tuner run --device cuda:0 --model resnet50 --max-latency 20ms --trials 30 2>&1 | tail -12
end=$(date +%s.%N)
cd $REPO
python3 -c "print('study wall s', round($end - $start, 1))" | tee $OUT/study-wall.txt
$B breakdown --db /tmp/study/studies/tune.db --out $OUT/breakdown.json
# 3. The graph knob at batch 1, 8, 32 (eager and CUDA graphs first; torch.compile with the time left)
$B graph --out $OUT/graph.json --graphs eager,cudagraphs --window 6 --min-window 2 --budget 200 2>&1 | grep -v "^$"
# 4. The study's best configuration in fixed 10 s windows and adaptive windows
$B check --pareto /tmp/study/studies/h200/resnet50/pareto.json --out $OUT/check.json --repeats 2 2>&1 | grep -v "^$"
tar czf $OUT/study.tgz -C /tmp/study studies
$B graph --out $OUT/graph-compile.json --graphs compile --window 6 --min-window 2 --budget $((490 - SECONDS)) 2>&1 | grep -v "^$"
nvidia-smi --query-gpu=$Q --format=csv > $OUT/nvidia-smi-after.csv
cat $OUT/nvidia-smi-before.csv $OUT/nvidia-smi-after.csv
echo "call seconds: $SECONDS"
