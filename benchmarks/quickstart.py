"""Measure the README's quick-start claim: resnet50 on sim:orin at 50 ms, 40 trials, default sampler.

For each seed, ``tune run``'s loop (run_study, in-memory storage) picks a best
configuration; its TRUE noise-free energy per query and p99 are compared with
tune sweep's optimum, and counts the nvpmodel mode switches the trials made
(consecutive trials in different modes, from the default mode) with their
modelled seconds (tuner.devices.switching). ``--switch-tie`` runs the
learned strategy at each given setting instead of the named samplers.
Writes benchmarks/results/quickstart.md.

Usage: PYTHONPATH=. python benchmarks/quickstart.py [--seeds 10] [--sampler NAME ...] [--switch-tie 0,0.1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import optuna

from tuner.devices.switching import SwitchCosts, switch_seconds
from tuner.devices.virtual.twin import TwinDevice
from tuner.measure.settings import WindowSettings
from tuner.run_options import DEFAULT_SAMPLER
from tuner.space import Config, SearchSpace
from tuner.strategies import LearnedSampler, has_torch
from tuner.study import MEMORY_STORAGE, RunOptions, narrowed_space, run_study
from tuner.sweep import optimum, run_sweep

MODEL, DEVICE, BOUND_MS, TRIALS = "resnet50", "sim:orin", 50.0, 40
TORCHLESS = (
    "no, as after a plain `pip install .` (the learned strategy does not use it; its fallback sampler "
    "would be TPE, not GP)"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--sampler", action="append", help=f"sampler(s) to measure (default {DEFAULT_SAMPLER})")
    parser.add_argument("--switch-tie", help="comma-separated switch_tie settings of the learned strategy")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "quickstart.md")
    args = parser.parse_args()
    ties = [float(t) for t in args.switch_tie.split(",")] if args.switch_tie else []
    samplers = [f"learned (switch_tie={t:g})" for t in ties] or args.sampler or [DEFAULT_SAMPLER]
    dev = TwinDevice(DEVICE)
    rows = run_sweep(dev, narrowed_space(dev, None, None), MODEL, WindowSettings(noise=False))
    truth = {json.dumps(r.config.key()): r.measurement for r in rows}
    best = optimum(rows, BOUND_MS)
    opt = best.measurement.j_per_query
    lines = [
        "# Quick-start claim: resnet50 on sim:orin, p99 <= 50 ms, 40 trials",
        "",
        f"command: `PYTHONPATH=. python benchmarks/quickstart.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        f"date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; machine: {platform.node()} "
        f"({platform.machine()}, Python {platform.python_version()})",
        "",
        "PyTorch installed: " + ("yes (the guided strategy refines with GP)" if has_torch() else TORCHLESS),
        "",
        f"tune sweep optimum (noise-free): {best.config.label()}, {opt:.4f} J/query, "
        f"p99 {best.measurement.p99_ms:.1f} ms",
        "",
        "Each seed runs tune run's loop (run_study; in-memory storage, the twin's seeded noise); the reported",
        "best is scored by its TRUE noise-free energy and latency.",
        "",
        "| sampler | seeds | within 5% | within 2% | median gap | worst gap | truly over 50 ms | mode switches "
        "(mean) | switching s (mean, modelled) | seconds/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    space = dev.space()
    for sampler in samplers:
        gaps, over, seconds, switches, switching = [], 0, [], [], []
        for seed in range(args.seeds):
            started = time.monotonic()
            tie = ties[samplers.index(sampler)] if ties else None
            options = RunOptions(
                model=MODEL,
                max_latency_ms=BOUND_MS,
                trials=TRIALS,
                seed=seed,
                sampler="learned" if tie is not None else sampler,
                storage=MEMORY_STORAGE,
            )
            chosen = LearnedSampler(seed=seed, switch_tie=tie) if tie is not None else None
            study, summary = run_study(dev, options, sampler=chosen)
            seconds.append(time.monotonic() - started)
            count, pause = mode_switches(space, study)
            switches.append(count)
            switching.append(pause)
            if summary.best is None:
                gaps.append(float("inf"))
                continue
            key = json.dumps(
                (summary.best["batch_size"], *sorted((k, str(v)) for k, v in summary.best["config"].items()))
            )
            m = truth[key]
            gaps.append(m.j_per_query / opt - 1)
            over += m.p99_ms > BOUND_MS
        n = len(gaps)
        lines.append(
            f"| {sampler} | {n} | {sum(g <= 0.05 for g in gaps)}/{n} | {sum(g <= 0.02 for g in gaps)}/{n} | "
            f"{statistics.median(gaps):.1%} | {max(gaps):.1%} | {over}/{n} | {statistics.mean(switches):.1f} | "
            f"{statistics.mean(switching):.1f} | {statistics.mean(seconds):.1f} |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def mode_switches(space: SearchSpace, study: optuna.Study) -> tuple[int, float]:
    """Mode changes between consecutive measured trials (from the default configuration), and their seconds."""
    mode = space.mode_knob
    before = space.default_config()
    count, seconds = 0, 0.0
    for t in sorted(study.trials, key=lambda t: t.number):
        if "effective" not in t.user_attrs or "reused_from" in t.user_attrs or "qps" not in t.user_attrs:
            continue
        now = Config(knobs=t.user_attrs["effective"], batch_size=t.user_attrs["batch_size"])
        count += str(now.knobs[mode]) != str(before.knobs[mode])
        seconds += switch_seconds(space, SwitchCosts(), before, now)
        before = now
    return count, seconds


if __name__ == "__main__":
    main()
