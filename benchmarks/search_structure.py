"""Where the optimum's batch size lies on generated boards (issue 12): the noise-free sweep of each landscape.

Usage: PYTHONPATH=. python benchmarks/search_structure.py [--boards 0-19,2000-2039]

For each board's landscape (the workload and bound the benchmark gives its
seed) it prints the optimum's batch size beside the largest batch size any
configuration can run within the bound and the largest one the default
configuration can, how much worse the best configuration of the next-best
batch size is, and how many configurations lie within 2% of the optimum; then
how often the optimum's batch size is the default's largest feasible one.
Development boards only: the judged boards (1000-1059) stay unseen.
"""

from __future__ import annotations

import argparse
import json
import math

from tuner import bench
from tuner.bench import BenchSettings, build_landscapes, truth
from tuner.landscapes import board_seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--boards", default="0-19,2000-2039")
    args = parser.parse_args()
    seeds = [s for part in args.boards.split(",") for s in board_seeds(part)]
    settings = BenchSettings(devices=[], models=[], tune_boards=[], judge_boards=seeds, strategies=["ours"])
    same = 0
    lands = build_landscapes(settings)
    print(
        "| board | bound | knobs | configurations | optimum's batch | largest feasible | default's largest "
        "feasible | next batch's best / optimum | within 2% |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for land in lands:
        space = bench.device(land.device).space()
        default = space.default_config().knobs
        rows = [(json.loads(k), j, lat) for k, (j, lat) in truth(land.device, land.model, "p99").items()]
        feasible = [(j, k) for k, j, lat in rows if lat <= land.max_latency_ms]
        largest = max(k[0] for _, k in feasible)
        at_default = [
            k[0]
            for k, _, lat in rows
            if lat <= land.max_latency_ms and all(str(default[n]) == str(v) for n, v in k[1:])
        ]
        default_largest = max(at_default, default=None)
        per_batch: dict[int, float] = {}
        for j, k in feasible:
            per_batch[k[0]] = min(per_batch.get(k[0], math.inf), j)
        ranked = sorted(per_batch.values())
        second = f"{ranked[1] / ranked[0]:.2f}" if len(ranked) > 1 else "-"
        within = sum(1 for j, _ in feasible if j <= 1.02 * land.optimum_j)
        opt_b = land.optimum["batch_size"]
        same += opt_b == default_largest
        print(
            f"| {land.device} | {land.bound} | {len(space.tuned_knobs)} | {len(rows)} | {opt_b} | {largest} | "
            f"{default_largest} | {second} | {within} |"
        )
    print(f"\nThe optimum's batch size is the default configuration's largest feasible one on {same} of {len(lands)}.")


if __name__ == "__main__":
    main()
