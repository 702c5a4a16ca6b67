"""The default strategy against random search on a measured board: a real card's windows replayed.

Usage: PYTHONPATH=. python benchmarks/measured_search.py [--seeds 10] [--jobs 2] [--build-table]
       [--models resnet50,bert-base] [--bounds q25,q50,q75] [--out benchmarks/results]

--build-table first rebuilds tuner/devices/virtual/recordings/h200-observe-space.json
from the raw windows under benchmarks/results/h200-observe/ (written by
benchmarks/h200_observe_space.py on the lent H200). The landscapes are
``measured:h200`` (tuner/devices/virtual/recorded.py) for each model and bound; the ground
truth is the mean of each configuration's measured windows, and every trial
of a strategy gets one of the real windows, drawn with its seed. Same code as
``tune bench`` (tuner/bench.py); this script adds the per-landscape table:
median measured trials to within 2% of the optimum, the share of runs that
got there within 40 measured trials, and how often the exported
configuration violates the bound when measured again (a fresh draw among
its windows).

Writes measured-search.json and measured-search-tables.md under --out.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import datetime as dt
import json
import math
import platform
import statistics
import sys
from pathlib import Path

from tuner.bench import BenchReport, BenchSettings, markdown, run_bench
from tuner.devices.virtual.recorded import DATA, RecordedBoard, table_from_raw
from tuner.sampling import canonical

RAW = Path(__file__).parent / "results" / "h200-observe"
WITHIN = 40


def landscape_rows(report: BenchReport) -> list[dict]:
    """Per landscape and strategy: median trials to 2%, share within 40 trials, violations, final regret."""
    board = RecordedBoard("measured:h200")
    rows = []
    for i, land in enumerate(report.landscapes):
        near = _near_optimum(board, land.model, land.max_latency_ms, land.optimum_j)
        for strategy in report.settings.strategies:
            runs = [r for r in report.runs if r.landscape == i and r.strategy == strategy]
            reach = sorted(r.reach["2%"] if r.reach["2%"] is not None else math.inf for r in runs)
            violations = [r.violation for r in runs if r.violation is not None]
            finals = [r.final_regret if r.final_regret is not None else math.inf for r in runs]
            rows.append(
                {
                    "model": land.model,
                    "bound": land.bound,
                    "max_latency_ms": land.max_latency_ms,
                    "feasible_fraction": land.feasible_fraction,
                    "optimum": land.optimum,
                    "optimum_j": land.optimum_j,
                    "within_2pct": near,
                    "strategy": strategy,
                    "runs": len(runs),
                    "median_to_2pct": statistics.median(reach) if reach else math.nan,
                    "reached_2pct_within_40": sum(x <= WITHIN for x in reach) / len(reach) if reach else math.nan,
                    "median_measured": statistics.median(r.measured for r in runs) if runs else math.nan,
                    "violation": sum(violations) / len(violations) if violations else math.nan,
                    "median_final_regret": statistics.median(finals) if finals else math.nan,
                }
            )
    return rows


def _near_optimum(board: RecordedBoard, model: str, bound: float, opt: float) -> int:
    """Feasible configurations (true mean) within 2% of the optimum: how many targets a search can hit."""
    count = 0
    for entry in board.table.models[model].configs:
        truth = [statistics.fmean(getattr(w, k) for w in entry.windows) for k in ("j_per_query", "p99_ms")]
        count += truth[1] <= bound and truth[0] <= opt * 1.02
    # channels_last measured once for a model where it does nothing: both values count.
    return count * (2 if board.table.models[model].same_as else 1)


def table(rows: list[dict], budget: dict[str, int]) -> str:
    head = (
        "| model | bound | p99 bound | feasible | configs within 2% | strategy | runs | median trials to 2% | "
        "reached 2% within 40 | exported best violates | median final regret |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        median = r["median_to_2pct"]
        text = f">{budget[r['strategy']]}" if not math.isfinite(median) else f"{median:.0f}"
        regret = r["median_final_regret"]
        lines.append(
            f"| {r['model']} | {r['bound']} | {r['max_latency_ms']:.2f} ms | {r['feasible_fraction']:.0%} | "
            f"{r['within_2pct']} | {r['strategy']} | {r['runs']} | {text} | {r['reached_2pct_within_40']:.0%} | "
            f"{r['violation']:.1%} | {'no feasible' if not math.isfinite(regret) else f'{regret:.1%}'} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--random-trials", type=int, default=200)
    parser.add_argument("--models", default="resnet50,bert-base")
    parser.add_argument("--bounds", default="q25,q50,q75")
    parser.add_argument("--strategies", default="learned,random")
    parser.add_argument("--build-table", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if args.build_table:
        raw = sorted(RAW.glob("observe-*.json"))
        (DATA / "h200-observe-space.json").write_text(table_from_raw(raw).model_dump_json(indent=0) + "\n")
    settings = BenchSettings(
        devices=["measured:h200"],
        models=args.models.split(","),
        bounds=args.bounds.split(","),
        strategies=[canonical(s) for s in args.strategies.split(",")],
        seeds=args.seeds,
        trials=args.trials,
        random_trials=args.random_trials,
        jobs=args.jobs,
        tune_boards=[],
        judge_boards=[],
    )
    started = dt.datetime.now(dt.timezone.utc)
    report = run_bench(
        settings, progress=lambda done, total, stage: print(f"\r{stage} {done}/{total}", end="", file=sys.stderr)
    )
    print(file=sys.stderr)
    rows = landscape_rows(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "measured-search.json").write_text(
        json.dumps({"report": report.model_dump(mode="json"), "landscapes": rows}, indent=1, default=str) + "\n"
    )
    budget = {s: args.random_trials if s == "random" else args.trials for s in settings.strategies}
    command = "PYTHONPATH=. python " + " ".join(["benchmarks/measured_search.py", *sys.argv[1:]])
    board = RecordedBoard("measured:h200")
    text = (
        f"command: `{command}`\n\nstarted: {started:%Y-%m-%d %H:%M} UTC, {report.seconds:.0f} s, "
        f"{platform.node()} ({platform.machine()}, {platform.python_version()})\n\n"
        f"board: {board.describe()['title']}\n\n" + table(rows, budget) + "\n" + markdown(report)
    )
    (args.out / "measured-search-tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
