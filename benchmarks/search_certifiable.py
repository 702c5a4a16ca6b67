"""How much of the exported best's distance to the optimum is the latency promise, and how much the search.

Usage: PYTHONPATH=. python benchmarks/search_certifiable.py RUNS.json

RUNS.json is a ``tune bench`` / benchmarks/search.py result over generated
boards. The benchmark's optimum is noise-free: its latency may sit just under
the bound, where no run can certify it (the re-measurement's margin is
1.645 x the relative latency spread x sqrt(1 + 1/3)). For each generated
landscape this script finds the *certifiable optimum*: the cheapest
configuration whose noise-free latency, raised by that margin with the
board's own time noise as the spread, still meets the bound. An approximation
(the run estimates the spread from its windows, and p99 carries tail jitter
too), but it separates an export held back by the promise from one the search
left behind. Prints how many exports are more than 5% over the optimum and
how many of those are within 2% of the certifiable optimum, and the exports'
distance to the certifiable optimum (median, p75, p90, runs over 20%).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from tuner.bench import certifiable_optimum, truth
from tuner.landscapes import GeneratedBoard
from tuner.objective import NOISE_Z


def certifiable_regret(landscape: dict, percentile: str) -> float:
    """The certifiable optimum's true energy over the noise-free optimum, minus one (inf if there is none)."""
    board = GeneratedBoard(landscape["device"])
    margin = NOISE_Z * board.physics.noise_time * math.sqrt(1 + 1 / 3)
    table = truth(landscape["device"], landscape["model"], percentile)
    return certifiable_optimum(table, landscape["max_latency_ms"], margin) / landscape["optimum_j"] - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", type=Path)
    args = parser.parse_args()
    report = json.loads(args.runs.read_text())
    percentile = report["settings"].get("percentile", "p99")
    landscapes = report["landscapes"]
    cert = {
        i: certifiable_regret(land, percentile)
        for i, land in enumerate(landscapes)
        if land["device"].startswith("gen:")
    }
    runs = [r for r in report["runs"] if r["landscape"] in cert]
    export = np.array([math.inf if r["final_regret"] is None else r["final_regret"] for r in runs])
    bound = np.array([cert[r["landscape"]] for r in runs])
    far = export > 0.05
    held = far & (1 + export <= (1 + bound) * 1.02)
    gap = (1 + export) / (1 + bound) - 1
    values = np.array(list(cert.values()))
    print(f"{len(runs)} runs on {len(cert)} generated landscapes")
    print(f"exports more than 5% over the optimum: {far.sum()}; within 2% of the certifiable optimum: {held.sum()}")
    print(
        f"certifiable optimum over the optimum: median {np.median(values):.1%}, p90 {np.percentile(values, 90):.1%}; "
        f"more than 5% on {(values > 0.05).sum()} of {len(values)} landscapes"
    )
    print(
        f"export over the certifiable optimum: median {np.median(gap):.1%}, p75 {np.percentile(gap, 75):.1%}, "
        f"p90 {np.percentile(gap, 90):.1%}, over 20% in {(gap > 0.2).sum()} runs"
    )


if __name__ == "__main__":
    main()
