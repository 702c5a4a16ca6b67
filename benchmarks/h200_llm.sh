#!/usr/bin/env bash
# Issue 50's LLM targets on a lent H200, observe-only (benchmarks/llm_h200.py says what each section measures).
# Run from a copy of the repository holding .whl/ (optuna, pydantic, loadgen... as wheels); $OUT gets 7 files.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import transformers, torch, optuna, mlperf_loadgen; print('transformers', transformers.__version__, 'torch', torch.__version__)"
WORK=/tmp/llm-h200
rm -rf $WORK
timeout 420 python3 benchmarks/llm_h200.py $WORK --budget 350
cp $WORK/llm_h200.json $WORK/llm_h200.md $OUT/
study=$(ls -d $WORK/studies/*/*/server-* 2>/dev/null | head -1)
[ -n "$study" ] && cp $study/trials.csv $study/pareto.json $study/pareto.png $OUT/
echo "call seconds: $SECONDS"
