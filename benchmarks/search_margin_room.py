"""What the latency promise allows on a device's landscapes: the optimum's slack and the certifiable energy.

Usage: PYTHONPATH=. python benchmarks/search_margin_room.py --devices sim:h200 \
           --models resnet50,bert-base,mobilenet_v2 [--margins 0.02,0.035,0.05]

For each landscape of the search benchmark (the same sweeps and bounds as ``tune bench``):
the optimum's noise-free latency over the bound, and for each margin m the cheapest
configuration whose noise-free latency x (1 + m) meets the bound, over the optimum. The
re-measurement's margin is 1.645 x the pooled latency spread x sqrt(1 + 1/3), so where the
optimum sits within m of the bound no run can certify it. Twins and measured boards have no
single noise figure, hence the margins as inputs (benchmarks/search_certifiable.py does the
same for generated boards from each board's own noise). Noise-free sweeps: on sim:h200 about
five minutes per model.
"""

from __future__ import annotations

import argparse
import json

from tuner.bench import BenchSettings, build_landscapes, certifiable_optimum, truth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--margins", default="0.02,0.035,0.05")
    args = parser.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    settings = BenchSettings(
        devices=args.devices.split(","),
        models=args.models.split(","),
        tune_boards=[],
        judge_boards=[],
        strategies=["ours"],
    )
    for land in build_landscapes(settings):
        table = truth(land.device, land.model, settings.percentile)
        bound, optimum = land.max_latency_ms, land.optimum_j
        at_optimum = min(lat for j, lat in table.values() if abs(j - optimum) <= 1e-12 * optimum and lat <= bound)
        row = {
            "device": land.device,
            "model": land.model,
            "bound": land.bound,
            "optimum_latency_over_bound": round(at_optimum / bound, 4),
        }
        for m in margins:
            row[f"certifiable_over_optimum@{m:g}"] = round(certifiable_optimum(table, bound, m) / optimum - 1, 4)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
