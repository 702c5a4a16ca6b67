"""Whether two code versions make the same proposals: the default strategy's whole studies, trial for trial.

For each case (twin or generated board, model, seed) every version runs a
40-trial study with the default sampler, ``LearnedSampler(seed=seed)``, in
memory, in a fresh process with the version's folder first on the path (a
checkout, e.g. ``git worktree add DIR COMMIT``); the table says whether
every trial's effective configuration, proposer and energy per query are
equal to the first version's, and at which trial they first differ. A
speed-up that changes figures only in their last bits should show
"identical" everywhere; one that changes a proposal needs the quality
benchmarks (``tune bench --quick``, benchmarks/search.py) instead.

    PYTHONPATH=. python benchmarks/proposal_identity.py --version before=/path/to/old --version after=.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
from pathlib import Path

from tune_process import child_json

CASES = [
    ("sim:orin", "resnet50", 1),
    ("sim:orin", "resnet50", 2),
    ("sim:orin", "resnet50", 3),
    ("sim:orin-nano", "mobilenet_v2", 1),
    ("sim:h200", "bert-base", 1),
    ("gen:3", "wl-conv", 1),
]
BOUNDS = {"sim:orin": 50.0, "sim:h200": 20.0, "sim:orin-nano": 80.0}
CHILD = r"""
import json, sys
from tuner.devices.registry import open_device
from tuner.run_options import RunOptions
from tuner.strategies import LearnedSampler
from tuner.study import MEMORY_STORAGE, run_study
device, model, seed, bound, trials = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if bound == "median":
    from tuner.bench import truth  # a generated board's bound: the median tail latency of its sweep
    lats = sorted(lat for _, lat in truth(device, model, "p99").values())
    bound = round(lats[len(lats) // 2], 3)
options = RunOptions(model=model, max_latency_ms=float(bound), trials=trials, seed=seed, storage=MEMORY_STORAGE)
study, _ = run_study(open_device(device), options, sampler=LearnedSampler(seed=seed))
rows = [
    (t.user_attrs.get("effective_key"), t.user_attrs.get("proposed_by"), t.user_attrs.get("j_per_query"))
    for t in sorted(study.trials, key=lambda t: t.number)
]
sys.stdout.write(json.dumps(rows))
"""


def run_case(folder: Path, device: str, model: str, seed: int, trials: int) -> list:
    """One study of one code version in a fresh process: (key, proposer, J/query) per trial."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    bound = str(BOUNDS.get(device, "median"))
    return child_json(folder, CHILD, [device, model, str(seed), bound, str(trials)], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    versions = [(name, Path(folder).resolve()) for name, folder in (v.split("=", 1) for v in args.version)]
    lines = [
        "# Proposals of the default strategy, version against version (twins and a generated board)",
        "",
        f"command: `PYTHONPATH=. python benchmarks/proposal_identity.py {' '.join(sys.argv[1:])}`",
        "",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.node()} "
        f"({platform.machine()}, Python {platform.python_version()}); {args.trials} trials a study, in memory",
        "",
        "| case | " + " | ".join(f"{name} vs {versions[0][0]}" for name, _ in versions[1:]) + " |",
        "|---|" + "---|" * (len(versions) - 1),
    ]
    for device, model, seed in CASES:
        runs = [run_case(folder, device, model, seed, args.trials) for _, folder in versions]
        cells = []
        for rows in runs[1:]:
            first = next((i for i, (a, b) in enumerate(zip(runs[0], rows, strict=False)) if a != b), None)
            if first is None and len(rows) == len(runs[0]):
                cells.append(f"identical ({len(rows)} trials)")
            else:
                cells.append(f"differs from trial {first if first is not None else min(len(rows), len(runs[0]))}")
        lines.append(f"| {device} {model} seed {seed} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
