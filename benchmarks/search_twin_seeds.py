"""The default strategy on twin landscapes at chosen run seeds (issue 12).

Usage: PYTHONPATH=. python benchmarks/search_twin_seeds.py --device sim:h200 \
           --models resnet50,bert-base,mobilenet_v2 --seeds 3,4,5 [--out runs.json]

``benchmarks/search.py --seeds N`` runs seeds 0..N-1; a twin figure judged at more seeds, or a
variant set against main's committed runs at new seeds, needs seeds that do not repeat those.
Each landscape (model x bound, the benchmark's own, tuner/bench.py) is run once per seed
through the benchmark's run_one in this process, so LearnedSampler attributes set by a caller
hold. The noise-free sweep of sim:h200 (290,400 configurations per model) takes most of the
time: about 20 minutes for three models on the VM.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
from pathlib import Path

import numpy as np
import optuna

from tuner.bench import twin_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", required=True)
    parser.add_argument("--models", default="resnet50")
    parser.add_argument("--seeds", default="3,4,5")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = twin_runs(
        args.device,
        args.models.split(","),
        seeds,
        progress=lambda r: print(r["model"], r["bound"], r["seed"], r["reach"], flush=True),
    )
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "seeds": seeds, "runs": runs}, indent=1))
    reach = np.array([r["reach"] or np.inf for r in runs], dtype=float)
    print(
        f"{args.device}: {len(reach)} runs, median to 2% {np.percentile(reach, 50, method='higher')}, "
        f"reached {np.isfinite(reach).mean():.0%}, mean (misses as 41) {np.minimum(reach, 41).mean():.1f}"
    )


if __name__ == "__main__":
    main()
