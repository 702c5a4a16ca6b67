"""One benchmark run of the default strategy, trial by trial, against the noise-free truth.

Usage: PYTHONPATH=. python benchmarks/search_trace.py gen:2004 [--seed 1]
       PYTHONPATH=. python benchmarks/search_trace.py sim:h200 --model bert-base --bound medium [--seed 0]

The landscape is the benchmark's own (tuner/bench.py: a generated board's workload and bound
come from its seed; a twin's from --model and --bound). Prints the optimum, how many
configurations are within 2% of it, then per trial: its true energy and latency (over the
optimum and over the bound), what the window measured, the true energy of the best the run
would report after it (``inf`` when that one truly misses the bound), who proposed it, and the
configuration. A trial marked M is a re-measurement (with the latency margin its mean had to
clear), R a reuse of an earlier window. The traces quoted in benchmarks/results/search.md were
made this way.
"""

from __future__ import annotations

import argparse
import math
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import optuna

from tuner.bench import BenchSettings, build_landscapes, device, true_ratio, truth
from tuner.devices.base import WindowSettings
from tuner.records import best_of
from tuner.study import MEMORY_STORAGE, RunOptions, run_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("device")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--bound", default="medium")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    generated = args.device.startswith("gen:")
    settings = BenchSettings(
        devices=[] if generated else [args.device],
        models=[] if generated else [args.model],
        bounds=[args.bound],
        tune_boards=[],
        judge_boards=[int(args.device[4:])] if generated else [],
        strategies=["ours"],
    )
    land = build_landscapes(settings)[0]
    table = truth(land.device, land.model, settings.percentile)
    bound, optimum = land.max_latency_ms, land.optimum_j
    within = sum(1 for j, lat in table.values() if lat <= bound and j <= 1.02 * optimum)
    print(f"{land.device} {land.model} {land.bound}: bound {bound:.4g} ms, optimum {optimum:.4g} J {land.optimum}")
    print(f"{len(table)} configurations, {within} within 2% of the optimum")
    options = RunOptions(
        model=land.model,
        max_latency_ms=bound,
        trials=args.trials,
        seed=args.seed,
        sampler="ours",
        storage=MEMORY_STORAGE,
        window=WindowSettings(seed=args.seed, percentile=settings.percentile),
    )
    study, _ = run_study(device(land.device), options)
    done = sorted((t for t in study.trials if t.state.is_finished()), key=lambda t: t.number)
    lat_key = f"{settings.percentile}_ms"
    for i, t in enumerate(done):
        attrs = t.user_attrs
        if "effective_key" not in attrs:
            continue
        true_j, true_lat = table.get(attrs["effective_key"], (math.nan, math.nan))
        shown = true_ratio(
            best_of([x for x in done[: i + 1] if x.state == optuna.trial.TrialState.COMPLETE]), table, bound, optimum
        )
        flag = "R" if "reused_from" in attrs else ("M" if "repeat_of" in attrs else " ")
        print(
            f"{t.number:2d}{flag} true E {true_j / optimum:6.3f} L {true_lat / bound:5.3f} | "
            f"measured E {attrs.get('j_per_query', math.nan) / optimum:6.3f} "
            f"L {attrs.get(lat_key, math.nan) / bound:5.3f} | "
            f"best {shown:6.3f} | {attrs.get('proposed_by', '')[:16]:16s} {attrs['effective_key']}"
            + (f" margin {attrs['latency_margin']:.1%}" if "latency_margin" in attrs else "")
        )


if __name__ == "__main__":
    main()
