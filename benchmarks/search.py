"""Run the search benchmark (the same code as ``tune bench``) and write search.json and search-tables.md.

Usage: PYTHONPATH=. python benchmarks/search.py [--seeds 1] [--board-runs 1] [--jobs 2] [--quick]
       [--devices sim:orin,...] [--models resnet50,...] [--strategies learned,random]
       [--tune-boards 0-19] [--judge-boards 1000-1059] [--out DIR]

BLAS is held to one thread per process: the models fitted per trial are
small, and on a shared 2-core machine threaded BLAS costs four times the CPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import datetime as dt
import platform
import sys
from pathlib import Path

from tuner.bench import BenchSettings, markdown, quick_settings, run_bench
from tuner.devices.virtual.generated import board_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--board-runs", type=int, default=1, help="runs per generated board, each at its own seed")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--random-trials", type=int, default=200)
    parser.add_argument("--devices")
    parser.add_argument("--models")
    parser.add_argument("--bounds")
    parser.add_argument("--strategies")
    parser.add_argument("--tune-boards")
    parser.add_argument("--judge-boards")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    settings = quick_settings() if args.quick else BenchSettings()
    update: dict = {}
    if not args.quick:
        update.update(
            seeds=args.seeds,
            board_runs=args.board_runs,
            jobs=args.jobs,
            trials=args.trials,
            random_trials=args.random_trials,
        )
    for key in ("devices", "models", "bounds", "strategies"):
        if getattr(args, key) is not None:
            update[key] = [x for x in getattr(args, key).split(",") if x and x != "none"]
    for key in ("tune_boards", "judge_boards"):
        text = getattr(args, key)
        if text is not None:
            update[key] = [] if text == "none" else board_seeds(text)
    settings = settings.model_copy(update=update)
    started = dt.datetime.now(dt.timezone.utc)
    report = run_bench(
        settings, progress=lambda done, total, stage: print(f"\r{stage} {done}/{total}", end="", file=sys.stderr)
    )
    print(file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "search.json").write_text(report.model_dump_json(indent=1))
    command = "PYTHONPATH=. python " + " ".join(["benchmarks/search.py", *sys.argv[1:]])
    (args.out / "search-tables.md").write_text(
        f"command: `{command}`\n\nstarted: {started:%Y-%m-%d %H:%M} UTC, {report.seconds:.0f} s, "
        f"{platform.node()} ({platform.machine()}, {platform.python_version()})\n\n" + markdown(report)
    )
    print(markdown(report))


if __name__ == "__main__":
    main()
