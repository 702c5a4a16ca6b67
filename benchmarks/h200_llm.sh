#!/usr/bin/env bash
# Issue 50's LLM targets on a lent H200, observe-only (benchmarks/llm_h200.py says what each section measures).
# Run from a copy of the repository holding .whl/ (optuna, pydantic, loadgen... as wheels); $OUT gets the
# summary (llm_h200.json, llm_h200.md) and, under study-RATEqps/, each study's trials.csv, pareto.json, pareto.png
# and its stderr.
# The dry run here: `OUT=/tmp/out PYTHON=/path/to/venv/python bash benchmarks/h200_llm.sh --cpu` (tiny-llm on
# the CPU, no wheels installed). One 600 s device call: the script's budget is 470 s, its hard stop 510 s
# (BUDGET=, HARD_STOP= change them).
set -uo pipefail
if [ "${1:-}" = "--cpu" ]; then
  PY=${PYTHON:-python3}
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
else
  PY=python3
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
fi
$PY -c "import transformers, torch, optuna, mlperf_loadgen; print('transformers', transformers.__version__, 'torch', torch.__version__)"
WORK=/tmp/llm-h200
rm -rf $WORK
mkdir -p "$OUT"
timeout ${HARD_STOP:-510} $PY benchmarks/llm_h200.py $WORK --budget ${BUDGET:-470} "$@"
cp $WORK/llm_h200.json $WORK/llm_h200.md "$OUT"/
for run in $WORK/study-*qps; do
  [ -d "$run" ] || continue
  mkdir -p "$OUT/$(basename "$run")"
  cp "$run"/study-stderr.txt "$OUT/$(basename "$run")"/
  study=$(ls -d "$run"/studies/*/*/server-* 2>/dev/null | head -1)
  [ -n "$study" ] && cp "$study"/trials.csv "$study"/pareto.json "$study"/pareto.png "$OUT/$(basename "$run")"/
done
echo "call seconds: $SECONDS"
