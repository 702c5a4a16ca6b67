"""Run the search benchmark (the same code as ``tune bench``) and write benchmarks/results/search.{json,md}.

Usage: PYTHONPATH=. python benchmarks/search.py [--seeds 3] [--jobs 2] [--quick]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
from pathlib import Path

from tuner.bench import BenchSettings, markdown, quick_settings, run_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--random-trials", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    settings = (
        quick_settings()
        if args.quick
        else BenchSettings(seeds=args.seeds, jobs=args.jobs, trials=args.trials, random_trials=args.random_trials)
    )
    started = dt.datetime.now(dt.timezone.utc)
    report = run_bench(settings, progress=lambda done, total: print(f"\r{done}/{total}", end="", file=sys.stderr))
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
